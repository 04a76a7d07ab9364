"""torch.nn module :class:`LLTM`: a multi-layer LLTM over whole sequences,
shaped like :class:`torch.nn.LSTM`."""
from __future__ import annotations

import functools
import numbers
import operator
import warnings

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence

from . import _directions, _packed, _schedule, _settings, _stack, _wavefront, functional, reference
from .modules import check_bool, check_int, refuse_torchscript, resolve_state, uniform_parameters


def _loop_of_cells(cell, input, weights, bias, h0, c0, lengths=None):
    """One layer as a Python loop of cells (the baselines); rows stop after
    lengths[b] steps (a [B] tensor, or None)."""
    if bias is None:
        bias = weights.new_zeros(weights.shape[0])
    h, c = h0, c0
    outputs = []
    for t, x_t in enumerate(input.unbind(0)):
        h_t, c_t = cell(x_t, weights, bias, h, c)
        if lengths is None:
            h, c = h_t, c_t
            outputs.append(h)
        else:  # rows past their length keep their state and output 0
            live = (lengths > t).unsqueeze(1)
            h, c = torch.where(live, h_t, h), torch.where(live, c_t, c)
            outputs.append(torch.where(live, h_t, 0))
    output = torch.stack(outputs) if outputs else input.new_empty(0, *h0.shape)
    return output, (h, c)


def _layer_native(input, weights, bias, h0, c0, lengths=None):
    return functional.lltm_sequence(input, weights, bias, h0, c0, lengths)  # (looked up per call)


_LAYERS = {"native": _layer_native,
           "reference": functools.partial(_loop_of_cells, reference.lltm_cell)}


# --- variable lengths ---------------------------------------------------------------------

_INDEX_CACHE: dict = {}
_INDEX_CACHE_SIZE = 32


def _on_device(key: tuple, device: torch.device, build):
    """The tensors build() makes on the CPU, moved to ``device`` once per key
    and reused (no host-to-device copy per call, which CUDA graph capture
    would refuse). Callers only read them."""
    if torch.compiler.is_compiling():
        return tuple(t.to(device) for t in build())
    key = (key, device)
    found = _INDEX_CACHE.get(key)
    if found is None:
        if len(_INDEX_CACHE) >= _INDEX_CACHE_SIZE:
            del _INDEX_CACHE[next(iter(_INDEX_CACHE))]
        found = _INDEX_CACHE[key] = tuple(t.to(device) for t in build())
    return found


def _check_lengths_tensor(lengths: torch.Tensor, expected: str) -> None:
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype in (
            torch.bool, torch.complex64, torch.complex128):
        raise ValueError(f"LLTM: lengths must be {expected}, got a {lengths.dtype} tensor of "
                         f"shape {list(lengths.shape)}")


def _check_lengths(lengths, T: int, B: int) -> list[int]:
    if isinstance(lengths, torch.Tensor):
        _check_lengths_tensor(lengths, "a 1-D integer tensor or a list of ints")
        lens = lengths.tolist()
    elif isinstance(lengths, (list, tuple)):
        lens = []
        for v in lengths:
            try:
                if isinstance(v, bool):
                    raise TypeError
                lens.append(operator.index(v))
            except TypeError:
                raise TypeError(f"LLTM: lengths must hold ints, got {type(v).__name__} "
                                f"{v!r}") from None
    else:
        raise TypeError("LLTM: lengths must be a 1-D integer tensor or a list of ints, got "
                        f"{type(lengths).__name__}")
    if len(lens) != B:
        raise ValueError(f"LLTM: lengths has {len(lens)} entries, expected one per batch row "
                         f"(B = {B})")
    for b, length in enumerate(lens):
        if not 1 <= length <= T:
            raise ValueError(f"LLTM: lengths[{b}] = {length}; every length must be in "
                             f"[1, T] with T = {T} steps in input")
    return lens


class LLTM(torch.nn.Module):
    """A multi-layer LLTM over whole sequences with the interface of
    :class:`torch.nn.LSTM` (the same arguments, but ``proj_size`` must be 0:
    the LLTM cell has no projection). ``impl``: ``"native"`` (default: one
    operator call per layer, the time loop in C or on the GPU) or
    ``"reference"`` (a Python loop of the plain PyTorch reference cell).

    Parameters of layer k: ``weights_l{k}`` [3H, I_k+H] (gate rows i, o, z;
    columns state then input; I_0 = input_size, I_k = D*H after) and
    ``bias_l{k}`` [3H], laid out like :class:`lltm.LLTMCell`'s; with
    bidirectional=True also ``weights_l{k}_reverse`` and ``bias_l{k}_reverse``.

    ``forward(input, hx=None, *, lengths=None) -> (output, (h_n, c_n))``
    (``state=``: an alias of ``hx``) takes and returns what nn.LSTM's does:
    [T, B, I] ([B, T, I] with batch_first), unbatched [T, I], or a
    PackedSequence; h_n and c_n [D*num_layers, B, H] ordered layer 0 forward,
    layer 0 reverse, layer 1 forward, ...

    Variable lengths: a PackedSequence (sorted or not, as in nn.LSTM), or
    padded input with ``lengths`` (B ints in [1, T], any order). Row b runs
    its first lengths[b] steps inside the kernels: output zero beyond them,
    h_n and c_n the state after the last, the reverse direction starting
    there. A list of lengths compiles into one graph per set of lengths; a
    lengths tensor or a PackedSequence breaks torch.compile's graph (their
    values are read on the host).

    On CUDA the two directions of a layer run concurrently (the reverse one
    on a side stream), eagerly and in captured CUDA graphs.
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
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError(f"LLTM: dropout must be a number in [0, 1], got {dropout!r}")
        if impl not in _LAYERS:
            raise ValueError(f"impl must be one of {list(_LAYERS)}, got {impl!r}")
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
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = 0
        self.impl = impl
        H = hidden_size
        D = 2 if bidirectional else 1
        for k in range(num_layers):
            layer_input = input_size if k == 0 else D * H
            for suffix in ("", "_reverse")[:D]:
                self.register_parameter(
                    f"weights_l{k}{suffix}",
                    torch.nn.Parameter(torch.empty(3 * H, layer_input + H, **factory)))
                if bias:
                    self.register_parameter(
                        f"bias_l{k}{suffix}", torch.nn.Parameter(torch.empty(3 * H, **factory)))
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def reset_parameters(self) -> None:
        uniform_parameters(self, self.hidden_size)

    def layer_parameters(self, k: int, reverse: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weights [3H, I_k+H], bias [3H] or None) of layer k (its reverse
        direction's with reverse=True)."""
        if not 0 <= k < self.num_layers:
            raise IndexError(f"layer {k} out of range for {self.num_layers} layers")
        if reverse and not self.bidirectional:
            raise IndexError("reverse=True: this LLTM is not bidirectional")
        suffix = "_reverse" if reverse else ""
        return getattr(self, f"weights_l{k}{suffix}"), getattr(self, f"bias_l{k}{suffix}", None)

    def __prepare_scriptable__(self):
        refuse_torchscript("lltm.LLTM")

    def _check_state(self, name: str, s: torch.Tensor, B: int, batched: bool) -> torch.Tensor:
        L = self.num_directions * self.num_layers
        want = (L, B, self.hidden_size) if batched else (L, self.hidden_size)
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != want:
            got = list(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
            raise ValueError(f"LLTM: {name} must have shape {list(want)}"
                             f"{'' if batched else ' (unbatched input)'}, got {got}")
        return s if batched else s.unsqueeze(1)

    def _initial_state(self, state, x: torch.Tensor, B: int, batched: bool):
        if state is None:
            zeros = x.new_zeros(self.num_directions * self.num_layers, B, self.hidden_size)
            return zeros, zeros
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise ValueError("LLTM: state must be a tuple (h0, c0)")
        return (self._check_state("h0", state[0], B, batched),
                self._check_state("c0", state[1], B, batched))

    def _time_major(self, input: torch.Tensor) -> torch.Tensor:
        """Tensor input as forward takes it, as [T, B, I]."""
        if input.dim() == 2:
            return input.unsqueeze(1)
        return input.transpose(0, 1) if self.batch_first else input

    def _check_features(self, I: int) -> None:
        if I != self.input_size:
            raise ValueError(f"LLTM: input has {I} features in its last dimension, expected "
                             f"input_size={self.input_size}")

    def forward(self, input: torch.Tensor, hx=None, *, state=None, lengths=None):
        state = resolve_state("LLTM", hx, state)
        if isinstance(input, PackedSequence):
            if lengths is not None:
                raise ValueError("LLTM: lengths is for padded input; a PackedSequence carries "
                                 "its own lengths")
            if _settings.onnx_exporting():
                # B and each row's steps are batch_sizes' values, read on the host
                raise ValueError("LLTM: a PackedSequence input cannot be exported to ONNX "
                                 "(torch.onnx.export): its layout depends on "
                                 "batch_sizes' values. Export padded input [T, B, I] with "
                                 "lengths= (an int64 tensor of B lengths) instead")
            return self._forward_packed(input, state)
        if not isinstance(input, torch.Tensor) or input.dim() not in (2, 3):
            got = list(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
            layout = "[B, T, I]" if self.batch_first else "[T, B, I]"
            raise ValueError(f"LLTM: input must be {layout} or unbatched [T, I], got {got} "
                             "(a PackedSequence is accepted too)")
        batched = input.dim() == 3
        x = self._time_major(input)
        T, B, I = x.shape
        self._check_features(I)
        if _settings.onnx_exporting():
            self._check_export(lengths)
        h0, c0 = self._initial_state(state, x, B, batched)
        if lengths is None:
            x, (h_n, c_n) = self._run(x, h0, c0, None)
        else:
            if not batched:
                raise ValueError("LLTM: lengths needs batched input [T, B, I] ([B, T, I] with "
                                 "batch_first); unbatched input has one length, T")
            if isinstance(lengths, torch.Tensor) and _settings.exporting():
                x, (h_n, c_n) = self._run_exported_lengths(x, h0, c0, lengths)
            else:
                x, (h_n, c_n) = self._run_lengths(x, h0, c0, _check_lengths(lengths, T, B))
        if not batched:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            x = x.transpose(0, 1)
        return x, (h_n, c_n)

    def _run_lengths(self, x, h0, c0, lens):
        """_run on rows of the given lengths (B ints) over the longest row's
        steps only; output zero-padded back to T steps."""
        T, B = x.shape[0], x.shape[1]
        if B == 0 or all(length == T for length in lens):
            return self._run(x, h0, c0, None)
        steps = max(lens)
        lengths, = _on_device(("lengths", tuple(lens)), x.device,
                              lambda: (torch.tensor(lens, dtype=torch.int64),))
        out, state = self._run(x[:steps], h0, c0, lengths)
        if steps < T:
            out = F.pad(out, (0, 0, 0, 0, 0, T - steps))
        return out, state

    def _check_export(self, lengths) -> None:
        """Under torch.onnx.export: refuses, by name, what would fix T or B to
        the example's values in the ONNX model. (Whether they are dynamic
        cannot be told here: the exporter's strict-mode retry traces sizes as
        ints.)"""
        if self.impl != "native":
            raise ValueError(f"LLTM(impl={self.impl!r}) cannot be exported to ONNX: it loops over the "
                             "steps in Python, which export unrolls for the example's T. "
                             "Export impl='native' (the default), one operator call a layer")
        if lengths is not None and not isinstance(lengths, torch.Tensor):
            raise ValueError("LLTM: lengths given as a list of ints cannot be exported to ONNX: the "
                             "values are read while exporting and fix T and B. Pass lengths "
                             "as an int64 tensor of B lengths, an input of the exported "
                             "program")

    def _run_exported_lengths(self, x, h0, c0, lengths: torch.Tensor):
        """_run_lengths in an exported program, where lengths' values are not
        known: over all T steps, the values unchecked."""
        _check_lengths_tensor(lengths, "a 1-D integer tensor")
        torch._check(lengths.shape[0] == x.shape[1],
                     lambda: "LLTM: lengths needs one entry per batch row")
        return self._run(x, h0, c0, lengths.to(device=x.device, dtype=torch.int64))

    def _forward_packed(self, packed: PackedSequence, state):
        data, batch_sizes, sorted_indices, unsorted_indices = packed
        if data.dim() != 2:
            raise ValueError(f"LLTM: a PackedSequence's data must be [N, I], got "
                             f"{list(data.shape)}")
        self._check_features(data.shape[1])
        # padded [T, B, I] in the packed (sorted) order, by gathers (_packed)
        T, B = len(batch_sizes), int(batch_sizes[0]) if len(batch_sizes) else 0
        positions, sources, lengths = _on_device(("packed", tuple(batch_sizes.tolist())),
                                                 data.device,
                                                 lambda: _packed.layout(batch_sizes))
        h0, c0 = self._initial_state(state, data, B, True)
        # nn.LSTM: hx comes in the original batch order (zeros need no reordering),
        # h_n and c_n go back to it
        order = sorted_indices if state is not None else None
        x, *moved = _packed.to_padded(data, positions, sources, T, B, (h0, c0), order,
                                      unsorted_indices)
        if moved:
            h0, c0 = moved
        if not B or int(batch_sizes[-1]) == B:  # every row runs all T steps
            lengths = None
        out, (h_n, c_n) = self._run(x, h0, c0, lengths)
        out_data, *moved = _packed.to_packed(out, positions, sources, (h_n, c_n),
                                             unsorted_indices, sorted_indices)
        if moved:
            h_n, c_n = moved
        return (PackedSequence(out_data, batch_sizes, sorted_indices, unsorted_indices),
                (h_n, c_n))

    def _run(self, x, h0, c0, lengths):
        """All layers over x [T, B, I]; row b stops after lengths[b] steps
        (an int64 [B] tensor on x's device, each in [1, T]; or None: all T).
        Returns (output [T, B, D*H], (h_n, c_n))."""
        schedule = _schedule.for_call(self, x)
        if schedule.route == "stacked":  # stacked layers in one call a group
            return _stack.run(self, x, h0, c0, list(schedule.groups), lengths)
        if schedule.route == "wavefront":  # stacked layers overlapped in time chunks
            return _wavefront.run(self, x, h0, c0, schedule.chunks, lengths, schedule.sharing)
        run_layer = _LAYERS[self.impl]
        reverse_index = None
        if self.num_directions == 2 and lengths is not None:
            reverse_index = _directions.reverse_index(lengths, x.shape[0])
        h_n, c_n = [], []  # [D, B, H] of each layer
        for k in range(self.num_layers):
            x, h, c = self._layer(run_layer, k, x, h0, c0, lengths, reverse_index,
                                  schedule.directions)
            h_n.append(h)
            c_n.append(c)
            if self.dropout > 0 and self.training and k < self.num_layers - 1:
                x = F.dropout(x, p=self.dropout, training=True)
        if len(h_n) == 1:  # no copy kernel, no host time for one layer
            return x, (h_n[0], c_n[0])
        return x, (torch.cat(h_n), torch.cat(c_n))

    def _direction(self, run_layer, k, reverse, x, h0, c0, lengths, reverse_index):
        weights, bias = self.layer_parameters(k, reverse)
        if reverse:  # each row reversed within its own length
            x = _directions.reverse_time(x, reverse_index)
        out, (h, c) = run_layer(x, weights, bias, h0, c0, lengths)
        if reverse:
            out = _directions.reverse_time(out, reverse_index)
        return out, h, c

    def _layer(self, run_layer, k, x, h0, c0, lengths, reverse_index, directions=""):
        """(output [T,B,D*H], h_n [D,B,H], c_n [D,B,H]) of layer k, its
        directions run as ``directions`` says (_schedule.Schedule)."""
        i = self.num_directions * k
        forward = (run_layer, k, False, x, h0[i], c0[i], lengths, reverse_index)
        if not self.bidirectional:
            out, h, c = self._direction(*forward)
            return out, h.unsqueeze(0), c.unsqueeze(0)  # views: no copy kernel
        if directions == "one node":
            # eager: both directions in one autograd node (the reverse one on
            # the side stream on CUDA)
            (w_f, b_f), (w_r, b_r) = self.layer_parameters(k), self.layer_parameters(k, True)
            if b_f is None:
                b_f, b_r = w_f.new_zeros(w_f.shape[0]), w_r.new_zeros(w_r.shape[0])
            return _directions.BothDirections.apply(x, w_f, b_f, w_r, b_r, h0[i:i + 2],
                                                    c0[i:i + 2], lengths, reverse_index)
        # "side stream": the reverse direction on the side stream, both
        # directions' calls planned for half the device each (resident
        # together, or the second waits for the first). "in line": in turn.
        fork = _directions._Fork(x, cuda=directions == "side stream")
        with fork.sharing():
            with fork.side():
                rev = self._direction(run_layer, k, True, x, h0[i + 1], c0[i + 1], lengths,
                                      reverse_index)
            fwd = self._direction(*forward)
        fork.join(*rev)
        return (torch.cat([fwd[0], rev[0]], dim=2), torch.stack([fwd[1], rev[1]]),
                torch.stack([fwd[2], rev[2]]))

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False),
                              ("dropout", 0.0), ("bidirectional", False), ("impl", "native")):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)!r}"
        return s
