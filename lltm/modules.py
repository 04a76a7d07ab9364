"""torch.nn modules: :class:`LLTMCell` (one step)."""
from __future__ import annotations

import math

import torch

from . import functional, reference

CELL_IMPLEMENTATIONS = {
    "native": functional.lltm_cell,
    "reference": reference.lltm_cell,
    "reference_function": reference.lltm_cell_function,
}


def check_int(owner: str, name: str, value, minimum: int) -> None:
    """An int (bools are not) of at least ``minimum``, like torch.nn.LSTM's checks."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be {'> 0' if minimum == 1 else f'>= {minimum}'}, "
                         f"got {value}")


def check_bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be a bool, got {type(value).__name__} {value!r}")


def resolve_state(owner: str, hx, state):
    """nn.LSTM's ``hx`` with this package's older keyword ``state`` as an alias."""
    if state is not None:
        if hx is not None:
            raise TypeError(f"{owner}.forward: got both hx and state (state is an alias of hx); "
                            "pass one")
        return state
    return hx


def refuse_torchscript(owner: str):
    raise RuntimeError(
        f"{owner} does not support torch.jit.script (TorchScript is deprecated in torch); "
        "use torch.compile, or torch.export and AOTInductor for deployment.")


def uniform_parameters(module: torch.nn.Module, H: int) -> None:
    """Every parameter uniform in +-1/sqrt(H), as the tutorial and nn.LSTM."""
    stdv = 1.0 / math.sqrt(H)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-stdv, stdv)


def _pair(state):
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError("LLTMCell: state must be a tuple (h, c) of Tensors, got "
                        f"{type(state).__name__}")
    return state


class LLTMCell(torch.nn.Module):
    """One LLTM step, laid out like the tutorial's ``LLTM`` module.

    Args:
        input_features: I, features of each input row.
        state_size: H, size of the hidden and cell state.
        impl: ``"native"`` (C / CUDA kernels, default), ``"reference"`` (plain
            PyTorch) or ``"reference_function"`` (the tutorial's hand-written
            backward), for comparisons.

    Parameters: ``weights`` [3H, I+H] (gate rows i, o, z; columns state then
    input) and ``bias`` [3H], uniform in +-1/sqrt(H) like the tutorial.

    ``forward(input [B, I], hx=None) -> (new_h, new_cell)``, each [B, H];
    ``hx`` is ``(h, c)``, zeros when omitted, as in :class:`torch.nn.LSTMCell`
    (``state=`` is accepted as a keyword alias). Unbatched like nn.LSTMCell:
    input [I] with h, c [H] each returns two [H] tensors.
    """

    def __init__(self, input_features: int, state_size: int, impl: str = "native",
                 device=None, dtype=None):
        super().__init__()
        check_int("LLTMCell", "input_features", input_features, 0)
        check_int("LLTMCell", "state_size", state_size, 1)
        if impl not in CELL_IMPLEMENTATIONS:
            raise ValueError(f"impl must be one of {sorted(CELL_IMPLEMENTATIONS)}, got {impl!r}")
        factory = {"device": device, "dtype": dtype}
        self.input_features = input_features
        self.state_size = state_size
        self.impl = impl
        self.weights = torch.nn.Parameter(
            torch.empty(3 * state_size, input_features + state_size, **factory))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        uniform_parameters(self, self.state_size)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The tutorial's C++ variant keeps bias as [1, 3H]: accept it.
        key = prefix + "bias"
        bias = state_dict.get(key)
        if bias is not None and bias.dim() == 2 and bias.shape[0] == 1:
            state_dict[key] = bias.reshape(-1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __prepare_scriptable__(self):
        refuse_torchscript("lltm.LLTMCell")

    def _check_input(self, input) -> None:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"LLTMCell: input must be a Tensor, got {type(input).__name__}")
        if input.dim() not in (1, 2) or input.shape[-1] != self.input_features:
            raise ValueError(f"LLTMCell: input must have shape [B, {self.input_features}] "
                             f"or unbatched [{self.input_features}] "
                             f"(input_features={self.input_features}), got {list(input.shape)}")

    def forward(self, input: torch.Tensor, hx=None, *, state=None):
        state = resolve_state("LLTMCell", hx, state)
        if isinstance(input, torch.Tensor) and input.dim() == 1:
            return self._forward_unbatched(input, state)
        # input is checked when a call fails (nothing on the way that works),
        # before the op's own message, so that a wrong feature count blames
        # input rather than weights.
        try:
            if state is None:
                old_h = old_cell = input.new_zeros(input.shape[0], self.state_size)
            else:
                old_h, old_cell = _pair(state)
            return CELL_IMPLEMENTATIONS[self.impl](input, self.weights, self.bias, old_h,
                                                   old_cell)
        except (AttributeError, IndexError, RuntimeError, TypeError, ValueError):
            self._check_input(input)
            raise

    def _forward_unbatched(self, input, state):
        """input [I], state ([H], [H]) or None: one row, as nn.LSTMCell."""
        self._check_input(input)
        if state is not None:
            for name, s in zip(("h", "c"), _pair(state)):
                if not isinstance(s, torch.Tensor) or s.dim() != 1:
                    got = list(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__
                    raise ValueError(f"LLTMCell: for unbatched input [{self.input_features}] "
                                     f"{name} must be 1-D [{self.state_size}], got {got}")
            state = (state[0].unsqueeze(0), state[1].unsqueeze(0))
        h, c = self.forward(input.unsqueeze(0), state)
        return h.squeeze(0), c.squeeze(0)

    def extra_repr(self) -> str:
        return f"{self.input_features}, {self.state_size}, impl={self.impl!r}"
