"""Both directions of one bidirectional layer (lltm.LLTM): the reverse
direction's time order, its CUDA side stream, and for eager calls both
directions as one autograd node (:class:`BothDirections`): one node instead
of seven saves the host time an eager bidirectional step at small sizes is
made of. torch.compile and torch.func keep the per-operator form.
"""
from __future__ import annotations

import contextlib

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _autotune, _differentiable, _native, _ops, _settings, _sharing

# the operators' autograd-free twins (lltm/_ops.py): called with gradient
# mode off inside the Function, they go straight to their device kernels
_FORWARD = torch.ops.lltm._sequence_forward
_BACKWARD = torch.ops.lltm._sequence_backward


def reverse_index(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """[T, B] time index reversing each row's first lengths[b] steps (the
    later, padded steps stay where they are). Its own inverse."""
    t = torch.arange(T, device=lengths.device).unsqueeze(1)
    return torch.where(t < lengths, lengths - 1 - t, t)


def reverse_time(x: torch.Tensor, index) -> torch.Tensor:
    """x [T, B, ...] with each row's steps reversed (within its length when
    ``index``, from reverse_index, is given)."""
    if index is None:
        return x.flip(0)
    return x.gather(0, index.unsqueeze(-1).expand(x.shape))


# --- the side streams ---------------------------------------------------------------------

_SIDE_STREAMS: dict = {}


def side_streams(device: torch.device, count: int = 1) -> list:
    """``count`` side streams of CUDA ``device``, made once and reused."""
    index = _native.cuda_index(device)
    pool = _SIDE_STREAMS.setdefault(index, [])
    while len(pool) < count:
        pool.append(torch.cuda.Stream(device=index))
    return pool[:count]


def concurrent(x: torch.Tensor) -> bool:
    """Whether work on ``x`` may fork onto side streams: on CUDA, eagerly or
    under capture (the graph holds every branch); not under torch.compile
    (which traces one stream) or torch.func."""
    return (x.is_cuda and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())


class _Fork:
    """The reverse direction's work on the side stream (where ``cuda``,
    default :func:`concurrent`) or in line: ``with fork.side()`` runs there;
    ``join`` makes the current stream wait for it and records ``tensors``
    made there on the current one. ``settings()`` / ``sharing()``: calls
    planned for SIDE_BY_SIDE layers at once where they run side by side."""

    SIDE_BY_SIDE = 2

    def __init__(self, x: torch.Tensor, cuda: bool | None = None):
        self.cuda = concurrent(x) if cuda is None else cuda
        if self.cuda:
            self.current = torch.cuda.current_stream(x.device)
            self.stream = side_streams(x.device)[0]
            self.stream.wait_stream(self.current)  # after what made the inputs

    def side(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def settings(self) -> int:
        return _settings.current(self.SIDE_BY_SIDE if self.cuda else 1)

    def sharing(self):
        return (_sharing.sharing_device(self.SIDE_BY_SIDE) if self.cuda
                else contextlib.nullcontext())

    def join(self, *tensors) -> None:
        if self.cuda:
            self.current.wait_stream(self.stream)
            for t in tensors:
                if t is not None:
                    t.record_stream(self.current)


def fused(x: torch.Tensor) -> bool:
    """Whether a bidirectional layer can run as one BothDirections node: not
    under torch.compile, torch.func, forward-mode AD or autocast."""
    return not (torch.compiler.is_compiling()
                or torch._C._are_functorch_transforms_active()
                or _forward_ad._current_level >= 0
                or torch._C._is_any_autocast_enabled())


class BothDirections(torch.autograd.Function):
    """One bidirectional layer: (x [T,B,I], w_f, b_f, w_r, b_r, h0 and c0
    [2,B,H], lengths [B] or None, reverse index [T,B] or None) -> (output
    [T,B,2H], h_n, c_n [2,B,H]), the reverse direction on the side stream on
    CUDA, forward and backward, through the operators' twins."""

    @staticmethod
    def forward(ctx, x, w_f, b_f, w_r, b_r, h0, c0, lengths, index):
        tail = _ops.lengths_tail(lengths)
        op = _ops.overload(_FORWARD, tail)
        fork = _Fork(x)
        # both directions' calls have one key: one measured plan
        settings = _autotune.forward_settings(ctx, fork.settings(), x, h0.shape[-1],
                                              any(ctx.needs_input_grad))
        with fork.side():
            x_r = reverse_time(x, index)
            res_r = op(x_r, w_r, b_r, h0[1], c0[1], *tail, settings)
            out_r = reverse_time(res_r[0], index)
        res_f = op(x, w_f, b_f, h0[0], c0[0], *tail, settings)
        fork.join(x_r, *res_r, out_r)
        ctx.save_for_backward(x, w_f, b_f, res_f[0], res_f[3], res_f[4],
                              x_r, w_r, b_r, res_r[0], res_r[3], res_r[4], h0, c0, *tail,
                              *_ops.lengths_tail(index))
        ctx.has_lengths = lengths is not None
        ctx.set_materialize_grads(False)
        return (torch.cat([res_f[0], out_r], 2), torch.stack([res_f[1], res_r[1]]),
                torch.stack([res_f[2], res_r[2]]))

    @staticmethod
    def backward(ctx, g_out, g_h, g_c):
        (x, w_f, b_f, out_f, cells_f, gates_f, x_r, w_r, b_r, out_r, cells_r, gates_r, h0, c0,
         *rest) = ctx.saved_tensors
        tail = tuple(rest[:ctx.has_lengths])
        index = rest[-1] if len(rest) > ctx.has_lengths else None
        H = h0.shape[-1]
        if g_out is None:
            g_out = out_f.new_zeros(*out_f.shape[:2], 2 * H)
        g_h, g_c = _ops.incoming_grads((g_h, g_c), (h0, c0))
        if torch.is_grad_enabled():
            # create_graph: the differentiable formulas (the reverse input
            # again from x, so that its gradient reaches x)
            d_f = _differentiable.sequence_backward(g_out[..., :H], g_h[0], g_c[0], x, w_f, b_f,
                                                    h0[0], c0[0], *tail)
            d_r = _differentiable.sequence_backward(
                reverse_time(g_out[..., H:], index), g_h[1], g_c[1], reverse_time(x, index), w_r,
                b_r, h0[1], c0[1], *tail)
            dx = d_f[0] + reverse_time(d_r[0], index)
            return (dx, d_f[1], d_f[2], d_r[1], d_r[2], torch.stack([d_f[3], d_r[3]]),
                    torch.stack([d_f[4], d_r[4]]), None, None)
        op = _ops.overload(_BACKWARD, tail)
        needs = ctx.needs_input_grad
        mask_f = (needs[0], needs[1], needs[2], needs[5], needs[6])
        mask_r = (needs[0], needs[3], needs[4], needs[5], needs[6])
        fork = _Fork(x)
        settings = _autotune.backward_settings(ctx, fork.settings())
        with fork.side():
            g_r = reverse_time(g_out[..., H:], index)
            d_r = op(g_r, g_h[1], g_c[1], x_r, w_r, h0[1], out_r, cells_r, gates_r, *tail,
                     mask_r, settings)
            dx_r = None if d_r[0] is None else reverse_time(d_r[0], index)
        d_f = op(g_out[..., :H], g_h[0], g_c[0], x, w_f, h0[0], out_f, cells_f, gates_f,
                 *tail, mask_f, settings)
        fork.join(g_r, *d_r, dx_r)
        dx = None if d_f[0] is None else d_f[0] + dx_r
        db_f = None if d_f[2] is None else d_f[2].view(b_f.shape)
        db_r = None if d_r[2] is None else d_r[2].view(b_r.shape)
        dh0 = None if d_f[3] is None else torch.stack([d_f[3], d_r[3]])
        dc0 = None if d_f[4] is None else torch.stack([d_f[4], d_r[4]])
        return dx, d_f[1], db_f, d_r[1], db_r, dh0, dc0, None, None
