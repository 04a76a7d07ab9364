"""Stacked unidirectional layers of :class:`lltm.LLTM` through
``lltm::stack_forward``: groups of 2 - 3 layers in one operator call each,
which on CUDA runs a group's recurrences in one launch a direction
(csrc/core/lltm_stack.h): layer l takes its step t at global step t + l, so
the layers share each step's grid barrier, and the layers above the first
form their input products inside the launch.

Where a layer's grid kernel spends its step waiting on the grid barrier
(small B x H), a group of L layers costs about two layers' time instead of
L; in eager mode one operator call a group also spares the host the calls
of every layer. lltm.LLTM takes this route (``route``) on CUDA where the
operator's stacked launch runs every group of these sizes, no layer has
dropout (in training) before the next, and (measured, docs/performance.md,
"Stacked layers in one launch"):
  - float32 (and the half types on GPUs before compute capability 8.0),
    under CUDA-graph capture, where a layer alone would run the grid family
    in GRID_GROUPS batch groups (B about 5 - 16 on an H100 or H200 at
    H 129 - 256): stacked 0.67x - 0.94x of a call a layer; in one group
    (B <= 4) 0.84x - 0.96x for two layers, even for three (0.97x - 1.08x).
    With 8 groups or more the stacked launch's layout is as fast or slower
    (0.99x - 4.8x); the cluster and block families (H <= 128) are faster
    than it (1.05x - 4.7x); eagerly, where B x H <= EAGER_MAX_BH: 0.32x -
    0.94x (a call a layer is bound by the host's time there; two of 84 rows
    1.02x and 1.20x); above, 0.83x - 2.6x, slower but at B32 with two layers;
  - float16 and bfloat16 on tensor-core GPUs, where the stacked launch forms
    its products on tensor cores with 16 units a block (bfloat16 on an
    H200, against a call a layer with the wavefront's time chunks): under
    capture where HALF_CAPTURED_BH[0] <= B x H <= HALF_CAPTURED_BH[1] and
    H >= HALF_MIN_H, 0.71x - 1.00x (B32 - B256 at H 128 - 256; one row of
    15, three layers B128/H128, 1.07x); below that B x H the cluster family
    runs a layer in a fraction of the stacked step (0.99x - 1.73x at B <=
    32, one row 0.89x), above it the stacked launch's blocks each carry
    several 16-row chunks (0.96x - 1.21x), and at H = 64 the block family
    is 2.1x - 2.4x faster; eagerly where B x H <= HALF_EAGER_MAX_BH: 0.29x -
    0.95x (B4 - B512, H 64 - 256; above, 0.98x - 1.07x).
Not under torch.compile or torch.func transforms (one call of the sequence
operator a layer there), unless ``lltm.overrides.stacked_layers`` forces it
("on": on any device, wherever the module allows it, the operator then
calling layer after layer where no stacked launch fits; "off": never).
"""
from __future__ import annotations

import functools

import torch

from . import _native, _ops, _settings, overrides

MAX_GROUP = 3  # the most layers one stacked launch holds (LLTM_STACK_MAX_LAYERS)
GRID_GROUPS = (2, 4)  # captured: a layer's grid plan in this many batch groups (1 for 2 layers)
EAGER_MAX_BH = 4096   # eager: B x H at most this
# the half types on tensor-core GPUs (the stacked launch on tensor cores):
HALF_CAPTURED_BH = (8192, 32768)  # captured: B x H within these
HALF_MIN_H = 128                  # captured: H at least this
HALF_EAGER_MAX_BH = 32768         # eager: B x H at most this

CHOICES_CACHED = 256  # route choices kept (shapes, devices, capture or not)


def groups(L: int) -> list[int]:
    """L layers in groups of at most MAX_GROUP, as even as they come (the
    larger first): 4 -> [2, 2], 5 -> [3, 2], 7 -> [3, 2, 2]."""
    count = -(-L // MAX_GROUP)
    base, extra = divmod(L, count)
    return [base + (k < extra) for k in range(count)]


def _automatic(x: torch.Tensor, H: int, sizes: list[int]) -> bool:
    if not x.is_cuda or torch.compiler.is_compiling() or (
            torch._C._are_functorch_transforms_active()):
        return False
    T, B, I = x.shape
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return _choice(index, x.dtype, T, B, I, H, tuple(sizes),
                   _native.stream_capturing(index), _settings.current())


@functools.lru_cache(maxsize=CHOICES_CACHED)
def _choice(index: int, dtype, T: int, B: int, I: int, H: int,  # noqa: E741
            sizes: tuple, capturing: bool, _settings_in_force: int) -> bool:
    """_automatic's answer, kept per key (the settings a call would run
    with, which the queries below follow: lltm._settings)."""
    return all(overrides.stack_plan_in_force(dtype, L, T, B, I if k == 0 else H, H, device=index)
               is not None for k, L in enumerate(sizes)) and _faster(
                   dtype, T, B, H, index, capturing, sizes)


def _faster(dtype, T: int, B: int, H: int, index: int, capturing: bool, sizes) -> bool:
    """Whether the stacked launch is the faster route for groups of
    ``sizes`` layers (the module's docstring)."""
    if dtype in (torch.float16, torch.bfloat16) and overrides.grid_tensor_cores(dtype,
                                                                               device=index):
        if not capturing:
            return B * H <= HALF_EAGER_MAX_BH
        return H >= HALF_MIN_H and HALF_CAPTURED_BH[0] <= B * H <= HALF_CAPTURED_BH[1]
    if not capturing:
        return B * H <= EAGER_MAX_BH
    layer = overrides.sequence_plan_in_force(dtype, T, B, H, H, device=index)
    if layer is None or layer["family"] != "grid":
        return False
    batch_groups = layer["forward"]["groups"]
    return all(GRID_GROUPS[0] <= batch_groups <= GRID_GROUPS[1] or (batch_groups == 1 and L == 2)
               for L in sizes)


def route(module, x: torch.Tensor) -> list[int] | None:
    """The layer groups (their sizes, bottom up) in which ``module`` (an
    lltm.LLTM of one direction and native layers) runs x [T, B, I] through
    lltm::stack_forward, or None: a call of the sequence operator a layer."""
    L = module.num_layers
    mode = overrides.current_stacked_layers()
    if L < 2 or mode == "off" or (module.dropout > 0 and module.training):
        return None
    sizes = groups(L)
    if mode == "on":
        return sizes
    if x.shape[0] == 0 or x.shape[1] == 0 or overrides.current_wavefront_chunks() is not None:
        return None
    return sizes if _automatic(x, module.hidden_size, sizes) else None


def run(module, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, sizes: list[int],
        lengths: torch.Tensor | None = None):
    """``module``'s layers over x [T, B, I] in groups of ``sizes`` layers, one
    operator call a group; h0, c0 [L, B, H]; lengths as for LLTM._run.
    Returns (output [T, B, H], (h_n, c_n)) as LLTM._run does."""
    h_n, c_n, first = [], [], 0
    for size in sizes:
        params = [module.layer_parameters(k) for k in range(first, first + size)]
        weights0 = params[0][0]
        weights = (torch.stack([w for w, _ in params[1:]]) if size > 1 else
                   weights0.new_empty(0, weights0.shape[0], 2 * module.hidden_size))
        if params[0][1] is None:
            biases = weights0.new_zeros(size, weights0.shape[0])
        else:
            biases = torch.stack([b for _, b in params])
        args = (x, weights0, weights, biases, h0[first:first + size], c0[first:first + size])
        if lengths is None:
            x, h, c, *_ = _ops.eager_call(_ops.StackForward, _STACK_FORWARD, *args)
        else:
            x, h, c, *_ = _ops.eager_call(_ops.StackLengthsForward, _STACK_FORWARD_LENGTHS,
                                          *args, lengths)
        h_n.append(h)
        c_n.append(c)
        first += size
    if len(h_n) == 1:
        return x, (h_n[0], c_n[0])
    return x, (torch.cat(h_n), torch.cat(c_n))


_STACK_FORWARD = torch.ops.lltm.stack_forward.default
_STACK_FORWARD_LENGTHS = torch.ops.lltm.stack_forward.lengths
