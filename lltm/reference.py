"""The tutorial's two pure-PyTorch LLTM implementations, kept as the oracle
every fast path is tested against (and as the benchmark's baselines).

- :func:`lltm_cell` / :class:`LLTM`: plain PyTorch, gradients by autograd.
- :class:`LLTMFunction`: an ``autograd.Function`` with the hand-written
  backward of the tutorial.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _step(X, weights, bias, old_cell):
    """(gate_weights, input_gate, output_gate, candidate_cell, new_h, new_cell)
    of a step with X = [h, x]."""
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return gate_weights, input_gate, output_gate, candidate_cell, new_h, new_cell


def lltm_cell(input, weights, bias, old_h, old_cell):
    """One step, plain PyTorch: X = [h, x]; g = X W^T + b; ... -> (new_h, new_cell)."""
    return _step(torch.cat([old_h, input], dim=1), weights, bias, old_cell)[4:]


def d_sigmoid(z):
    s = torch.sigmoid(z)
    return (1 - s) * s


def d_tanh(z):
    t = torch.tanh(z)
    return 1 - (t * t)


def d_elu(z, alpha=1.0):
    e = z.exp()
    mask = (alpha * (e - 1)) < 0
    return (z > 0).type_as(z) + mask.type_as(z) * (alpha * e)


class LLTMFunction(torch.autograd.Function):
    """The tutorial's forward with a hand-written backward."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        X = torch.cat([old_h, input], dim=1)
        gate_weights, input_gate, output_gate, candidate_cell, new_h, new_cell = _step(
            X, weights, bias.reshape(-1), old_cell)
        ctx.save_for_backward(X, weights, input_gate, output_gate, new_cell,
                              candidate_cell, gate_weights)
        ctx.bias_shape = bias.shape
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        X, weights, input_gate, output_gate, new_cell, candidate_cell, gate_weights = (
            ctx.saved_tensors)
        d_output_gate = torch.tanh(new_cell) * grad_h
        d_tanh_new_cell = output_gate * grad_h
        d_new_cell = d_tanh(new_cell) * d_tanh_new_cell + grad_cell
        d_old_cell = d_new_cell
        d_candidate_cell = input_gate * d_new_cell
        d_input_gate = candidate_cell * d_new_cell
        gates = gate_weights.chunk(3, dim=1)
        d_input_gate = d_input_gate * d_sigmoid(gates[0])
        d_output_gate = d_output_gate * d_sigmoid(gates[1])
        d_candidate_cell = d_candidate_cell * d_elu(gates[2])
        d_gates = torch.cat([d_input_gate, d_output_gate, d_candidate_cell], dim=1)
        d_weights = d_gates.t().mm(X)
        d_bias = d_gates.sum(dim=0).reshape(ctx.bias_shape)
        d_X = d_gates.mm(weights)
        state_size = grad_h.shape[1]
        d_old_h = d_X[:, :state_size]
        d_input = d_X[:, state_size:]
        return d_input, d_weights, d_bias, d_old_h, d_old_cell


def lltm_cell_function(input, weights, bias, old_h, old_cell):
    """One step through :class:`LLTMFunction`."""
    return LLTMFunction.apply(input, weights, bias, old_h, old_cell)


class LLTM(torch.nn.Module):
    """The tutorial's module, unchanged in its parameters: weights [3H, I+H],
    bias [3H]. Its state_dict loads into :class:`lltm.LLTMCell`."""

    def __init__(self, input_features, state_size):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size))
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        return lltm_cell(input, self.weights, self.bias, old_h, old_cell)
