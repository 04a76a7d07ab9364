"""The LLTM's derivatives in differentiable PyTorch operations, from the
operators' inputs only. The native backward kernels are not differentiable
and read forward outputs autograd treats as constants: where a backward
records its graph (``create_graph=True``, torch.func, Hessians), lltm/_ops.py
computes the gradients here, so second derivatives are exact. ``*_jvp``:
the forward-mode formulas. Gates as in ``csrc/core/lltm.h``: g = [h, x] W^T
+ b = [g_i | g_o | g_z], c' = c + sigmoid(g_i) elu(g_z), h' = tanh(c') sigmoid(g_o).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _elu_derivative(gz: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # elu'(g) = 1 for g > 0, exp(g) = elu(g) + 1 otherwise; written through z
    # so that no exp of a large positive g can overflow.
    return torch.where(gz > 0, torch.ones_like(z), z + 1)


def _activations(X, weights, bias):
    """(g_z, i, o, z) of a step with X = [h, x]."""
    gi, go, gz = F.linear(X, weights, bias.reshape(-1)).chunk(3, dim=1)
    return gz, torch.sigmoid(gi), torch.sigmoid(go), F.elu(gz)


def cell_backward(grad_h, grad_cell, input, weights, bias, old_h, old_cell):
    """(d_input, d_weights, d_bias [3H], d_old_h, d_old_cell) of one step,
    recomputing the step's activations from its inputs."""
    H = old_h.shape[1]
    X = torch.cat([old_h, input], dim=1)
    gz, i, o, z = _activations(X, weights, bias)
    tanh_c = torch.tanh(old_cell + i * z)
    d_cell = (1 - tanh_c * tanh_c) * o * grad_h + grad_cell
    d_g = torch.cat([z * d_cell * i * (1 - i),
                     tanh_c * grad_h * o * (1 - o),
                     i * d_cell * _elu_derivative(gz, z)], dim=1)
    d_X = d_g.mm(weights)
    return d_X[:, H:], d_g.t().mm(X), d_g.sum(0), d_X[:, :H], d_cell


def cell_forward(input, weights, bias, old_h, old_cell):
    """(new_h, new_cell, gates) as lltm::cell_forward returns them."""
    _, i, o, z = _activations(torch.cat([old_h, input], dim=1), weights, bias)
    new_cell = old_cell + i * z
    return torch.tanh(new_cell) * o, new_cell, torch.cat([i, o, z], dim=1)


def _live(lengths, t: int):
    """[B, 1]: True where step t lies within the row's length (None: all)."""
    return None if lengths is None else (lengths > t).unsqueeze(1)


def sequence_forward(input, weights, bias, h0, c0, lengths=None):
    """(output, h_n, c_n, cells, gates) as lltm::sequence_forward returns them
    (with ``lengths``: as its ``lengths`` overload, rows stopping after
    lengths[b] steps)."""
    h, c, outs, cells, gates = h0, c0, [], [], []
    for t, x in enumerate(input.unbind(0)):
        h_t, c_t, g = cell_forward(x, weights, bias, h, c)
        live = _live(lengths, t)
        if live is None:
            h, c = h_t, c_t
            outs.append(h)
        else:  # rows past their length keep their state; output and gates 0
            h, c = torch.where(live, h_t, h), torch.where(live, c_t, c)
            outs.append(torch.where(live, h_t, 0))
            g = torch.where(live, g, 0)
        cells.append(c)
        gates.append(g)
    if not outs:
        T0 = input.new_empty(0, *h0.shape)
        return T0, h0, c0, T0, input.new_empty(0, h0.shape[0], 3 * h0.shape[1])
    return torch.stack(outs), h, c, torch.stack(cells), torch.stack(gates)


def sequence_backward(grad_output, grad_h_n, grad_c_n, input, weights, bias, h0, c0,
                      lengths=None):
    """(d_input, d_weights, d_bias [3H], d_h0, d_c0) of one layer: the states
    recomputed from the inputs, then :func:`cell_backward` back through time
    (steps past a row's length pass the state's gradient through)."""
    bias = bias.reshape(-1)
    states = [(h0, c0)]
    for t, x in enumerate(input.unbind(0)[:-1] if input.shape[0] else ()):
        h, c, _ = cell_forward(x, weights, bias, *states[-1])
        live = _live(lengths, t)
        if live is not None:
            h, c = torch.where(live, h, states[-1][0]), torch.where(live, c, states[-1][1])
        states.append((h, c))
    d_h, d_c = grad_h_n, grad_c_n
    d_weights = torch.zeros_like(weights)
    d_bias = torch.zeros_like(bias)
    d_inputs = []
    for t in range(input.shape[0] - 1, -1, -1):
        h, c = states[t]
        live = _live(lengths, t)
        if live is None:
            d_x, d_w, d_b, d_h, d_c = cell_backward(d_h + grad_output[t], d_c, input[t],
                                                    weights, bias, h, c)
        else:  # zero gradients into the stopped rows' steps: no share of d_w, d_b, d_x
            d_x, d_w, d_b, d_h_t, d_c_t = cell_backward(
                torch.where(live, d_h + grad_output[t], 0), torch.where(live, d_c, 0),
                input[t], weights, bias, h, c)
            d_h, d_c = torch.where(live, d_h_t, d_h), torch.where(live, d_c_t, d_c)
        d_inputs.append(d_x)
        d_weights = d_weights + d_w
        d_bias = d_bias + d_b
    d_input = torch.stack(d_inputs[::-1]) if d_inputs else torch.zeros_like(input)
    return d_input, d_weights, d_bias, d_h, d_c


def _or_zeros(t, like):
    return torch.zeros_like(like) if t is None else t


def cell_jvp(input, weights, bias, old_h, old_cell,
             t_input, t_weights, t_bias, t_old_h, t_old_cell):
    """(new_h, new_cell, t_new_h, t_new_cell): one step and its tangents from
    its inputs' (None: zero), recomputed from the inputs so that they are
    differentiable again (nested jvp)."""
    X = torch.cat([old_h, input], dim=1)
    t_X = torch.cat([_or_zeros(t_old_h, old_h), _or_zeros(t_input, input)], dim=1)
    t_g = t_X.mm(weights.t())
    if t_weights is not None:
        t_g = t_g + X.mm(t_weights.t())
    if t_bias is not None:
        t_g = t_g + t_bias.reshape(-1)
    gz, i, o, z = _activations(X, weights, bias)
    tg_i, tg_o, tg_z = t_g.chunk(3, dim=1)
    new_cell = old_cell + i * z
    t_cell = (i * (1 - i) * tg_i) * z + i * (_elu_derivative(gz, z) * tg_z)
    if t_old_cell is not None:
        t_cell = t_cell + t_old_cell
    tanh_c = torch.tanh(new_cell)
    t_h = (1 - tanh_c * tanh_c) * o * t_cell + tanh_c * (o * (1 - o) * tg_o)
    return tanh_c * o, new_cell, t_h, t_cell


def sequence_jvp(input, weights, bias, h0, c0, t_input, t_weights, t_bias, t_h0, t_c0,
                 lengths=None):
    """Tangents (output, h_n, c_n) of one layer, step by step with :func:`cell_jvp`."""
    h, c = h0, c0
    t_h, t_c = _or_zeros(t_h0, h0), _or_zeros(t_c0, c0)
    t_out = []
    for t in range(input.shape[0]):
        step = cell_jvp(input[t], weights, bias, h, c,
                        None if t_input is None else t_input[t], t_weights, t_bias, t_h, t_c)
        live = _live(lengths, t)
        if live is None:
            h, c, t_h, t_c = step
            t_out.append(t_h)
        else:
            h, c, t_h, t_c = (torch.where(live, new, old)
                              for new, old in zip(step, (h, c, t_h, t_c)))
            t_out.append(torch.where(live, step[2], 0))
    t_output = torch.stack(t_out) if t_out else torch.zeros_like(input[..., :0]).expand(
        0, *h0.shape)
    return t_output, t_h, t_c


# --- stacked layers (lltm::stack_forward): layer l > 0 reads layer l-1's output ------

def _stack_layer(weights0, weights, l: int):
    return weights0 if l == 0 else weights[l - 1]


def stack_forward(input, weights0, weights, biases, h0, c0, lengths=None):
    """lltm::stack_forward's results: :func:`sequence_forward` layer after layer."""
    x, results = input, []
    for l in range(h0.shape[0]):
        results.append(sequence_forward(x, _stack_layer(weights0, weights, l), biases[l],
                                        h0[l], c0[l], lengths))
        x = results[-1][0]
    outs, h_n, c_n, cells, gates = (list(r) for r in zip(*results))
    below = (torch.stack(outs[:-1]) if len(outs) > 1
             else outs[0].new_empty(0, *outs[0].shape))
    return (outs[-1], torch.stack(h_n), torch.stack(c_n), below, torch.stack(cells),
            torch.stack(gates))


def stack_backward(grad_output, grad_h_n, grad_c_n, input, weights0, weights, biases, h0, c0,
                   lengths=None):
    """(d_input, d_weights0, d_weights, d_biases, d_h0, d_c0) of
    lltm::stack_forward: the layers' inputs recomputed, then
    :func:`sequence_backward` from the top layer down."""
    L = h0.shape[0]
    inputs = [input]
    for l in range(L - 1):
        inputs.append(sequence_forward(inputs[-1], _stack_layer(weights0, weights, l),
                                       biases[l], h0[l], c0[l], lengths)[0])
    d_out, grads = grad_output, [None] * L
    for l in range(L - 1, -1, -1):
        grads[l] = sequence_backward(d_out, grad_h_n[l], grad_c_n[l], inputs[l],
                                     _stack_layer(weights0, weights, l), biases[l], h0[l],
                                     c0[l], lengths)
        d_out = grads[l][0]
    d_w = [g[1] for g in grads[1:]]
    return (d_out, grads[0][1], torch.stack(d_w) if d_w else torch.zeros_like(weights),
            torch.stack([g[2] for g in grads]), torch.stack([g[3] for g in grads]),
            torch.stack([g[4] for g in grads]))


def stack_jvp(input, weights0, weights, biases, h0, c0, t_input, t_weights0, t_weights,
              t_biases, t_h0, t_c0, lengths=None):
    """Tangents (output, h_n, c_n) of lltm::stack_forward: :func:`sequence_jvp`
    layer after layer."""
    def part(t, l):
        return None if t is None else t[l]

    x, t_x, t_h, t_c = input, t_input, [], []
    for l in range(h0.shape[0]):
        w = _stack_layer(weights0, weights, l)
        t_w = t_weights0 if l == 0 else part(t_weights, l - 1)
        t_out, t_h_l, t_c_l = sequence_jvp(x, w, biases[l], h0[l], c0[l], t_x, t_w,
                                           part(t_biases, l), part(t_h0, l), part(t_c0, l),
                                           lengths)
        t_h.append(t_h_l)
        t_c.append(t_c_l)
        if l < h0.shape[0] - 1:
            x = sequence_forward(x, w, biases[l], h0[l], c0[l], lengths)[0]
        t_x = t_out
    return t_x, torch.stack(t_h), torch.stack(t_c)
