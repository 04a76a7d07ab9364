"""torch.nn module :class:`LLTM`: a multi-layer LLTM over whole sequences,
shaped like :class:`torch.nn.LSTM`."""
from __future__ import annotations

import math
import numbers
import warnings

import torch
import torch.nn.functional as F

from . import functional, reference
from .modules import check_bool, check_int, refuse_torchscript, resolve_state

SEQUENCE_IMPLEMENTATIONS = ("native", "native_cells", "reference")


def _loop_of_cells(cell, input, weights, bias, h0, c0):
    """One layer as a Python loop of cells, one call per step (the baselines)."""
    if bias is None:
        bias = weights.new_zeros(weights.shape[0])
    h, c = h0, c0
    outputs = []
    for x_t in input.unbind(0):
        h, c = cell(x_t, weights, bias, h, c)
        outputs.append(h)
    output = torch.stack(outputs) if outputs else input.new_empty(0, *h0.shape)
    return output, (h, c)


def _layer_native(input, weights, bias, h0, c0):
    return functional.lltm_sequence(input, weights, bias, h0, c0)


def _layer_native_cells(input, weights, bias, h0, c0):
    return _loop_of_cells(functional.lltm_cell, input, weights, bias, h0, c0)


def _layer_reference(input, weights, bias, h0, c0):
    return _loop_of_cells(reference.lltm_cell, input, weights, bias, h0, c0)


_LAYERS = {
    "native": _layer_native,
    "native_cells": _layer_native_cells,
    "reference": _layer_reference,
}


class LLTM(torch.nn.Module):
    """A multi-layer LLTM run over whole sequences, with the interface of
    :class:`torch.nn.LSTM`.

    Args:
        input_size: I, features of each input step.
        hidden_size: H, size of the hidden and cell state.
        num_layers: stacked layers; layer k > 0 reads layer k-1's output.
        bias: if False, the layers have no bias.
        batch_first: input and output are [B, T, .] instead of [T, B, .]
            (the state keeps the layout [num_layers, B, H]).
        dropout: dropout probability on each layer's output except the last,
            applied in training mode only.
        proj_size: accepted for nn.LSTM's signature; only 0 (LLTM has no
            projection).
        impl: ``"native"`` (default: one operator call per layer, the time
            loop in C or on the GPU), ``"native_cells"`` (a Python loop of
            native cells) or ``"reference"`` (a Python loop of the plain
            PyTorch reference cell), for comparisons.

    Parameters of layer k: ``weights_l{k}`` [3H, I_k+H] (gate rows i, o, z;
    columns state then input; I_0 = input_size, I_k = H after) and
    ``bias_l{k}`` [3H], laid out like :class:`lltm.LLTMCell`'s ``weights`` and
    ``bias``, so a trained cell's parameters move in and out of any layer.
    Initialised uniform in +-1/sqrt(H), like the cell and nn.LSTM.

    ``forward(input, hx=None) -> (output, (h_n, c_n))`` (``state=`` is accepted
    as a keyword alias of ``hx``):
        input [T, B, I] ([B, T, I] with batch_first), or [T, I] unbatched;
        state (h0, c0), each [num_layers, B, H] ([num_layers, H] unbatched),
        zeros when omitted; output [T, B, H] ([B, T, H] with batch_first, [T, H]
        unbatched), the last layer's h at every step; h_n, c_n
        [num_layers, B, H], every layer's final state.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None, dtype=None,
                 impl: str = "native"):
        super().__init__()
        check_int("LLTM", "input_size", input_size, 0)
        check_int("LLTM", "hidden_size", hidden_size, 1)
        check_int("LLTM", "num_layers", num_layers, 1)
        check_bool("LLTM", "bias", bias)
        check_bool("LLTM", "batch_first", batch_first)
        check_bool("LLTM", "bidirectional", bidirectional)
        check_int("LLTM", "proj_size", proj_size, 0)
        if proj_size != 0:
            raise ValueError(
                f"LLTM: proj_size={proj_size} is not supported: LLTM has no projection "
                "(nn.LSTM's h = W_hr h projects the output gate's product; the LLTM cell has no "
                "such weight). Use proj_size=0, or a torch.nn.Linear on the output; see the "
                "README's Use section")
        if bidirectional:
            raise NotImplementedError("LLTM: bidirectional=True is not implemented yet")
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError(f"LLTM: dropout must be a number in [0, 1], got {dropout!r}")
        if impl not in _LAYERS:
            raise ValueError(f"impl must be one of {list(SEQUENCE_IMPLEMENTATIONS)}, got {impl!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout applies between layers (to every layer's output but the "
                          f"last), so dropout={dropout} does nothing with num_layers=1",
                          stacklevel=2)
        factory = {"device": device, "dtype": dtype}
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.bidirectional = bidirectional
        self.proj_size = 0
        self.dropout = float(dropout)
        self.impl = impl
        H = hidden_size
        for k in range(num_layers):
            layer_input = input_size if k == 0 else H
            self.register_parameter(
                f"weights_l{k}",
                torch.nn.Parameter(torch.empty(3 * H, layer_input + H, **factory)))
            if bias:
                self.register_parameter(
                    f"bias_l{k}", torch.nn.Parameter(torch.empty(3 * H, **factory)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-stdv, stdv)

    def layer_parameters(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weights [3H, I_k+H], bias [3H] or None) of layer k."""
        if not 0 <= k < self.num_layers:
            raise IndexError(f"layer {k} out of range for {self.num_layers} layers")
        return getattr(self, f"weights_l{k}"), getattr(self, f"bias_l{k}", None)

    def __prepare_scriptable__(self):
        refuse_torchscript("lltm.LLTM")

    def _check_state(self, name: str, s: torch.Tensor, B: int, batched: bool) -> torch.Tensor:
        want = (self.num_layers, B, self.hidden_size) if batched else (
            self.num_layers, self.hidden_size)
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != want:
            got = list(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
            raise ValueError(f"LLTM: {name} must have shape {list(want)}"
                             f"{'' if batched else ' (unbatched input)'}, got {got}")
        return s if batched else s.unsqueeze(1)

    def forward(self, input: torch.Tensor, hx=None, *, state=None):
        state = resolve_state("LLTM", hx, state)
        if not isinstance(input, torch.Tensor) or input.dim() not in (2, 3):
            got = list(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            layout = "[B, T, I]" if self.batch_first else "[T, B, I]"
            raise ValueError(f"LLTM: input must be {layout} or unbatched [T, I], got {got}")
        batched = input.dim() == 3
        if not batched:
            x = input.unsqueeze(1)
        elif self.batch_first:
            x = input.transpose(0, 1)
        else:
            x = input
        T, B, I = x.shape
        if I != self.input_size:
            raise ValueError(f"LLTM: input has {I} features in its last dimension, expected "
                             f"input_size={self.input_size}")
        if state is None:
            h0 = c0 = x.new_zeros(self.num_layers, B, self.hidden_size)
        else:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise ValueError("LLTM: state must be a tuple (h0, c0)")
            h0 = self._check_state("h0", state[0], B, batched)
            c0 = self._check_state("c0", state[1], B, batched)

        run_layer = _LAYERS[self.impl]
        h_n, c_n = [], []
        for k in range(self.num_layers):
            weights, bias = self.layer_parameters(k)
            x, (h, c) = run_layer(x, weights, bias, h0[k], c0[k])
            h_n.append(h)
            c_n.append(c)
            if self.dropout > 0 and self.training and k < self.num_layers - 1:
                x = F.dropout(x, p=self.dropout, training=True)
        if self.num_layers == 1:  # views: no copy kernel, no host time for one
            h_n, c_n = h_n[0].unsqueeze(0), c_n[0].unsqueeze(0)
        else:
            h_n, c_n = torch.stack(h_n), torch.stack(c_n)
        if not batched:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            x = x.transpose(0, 1)
        return x, (h_n, c_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.impl != "native":
            s += f", impl={self.impl!r}"
        return s
