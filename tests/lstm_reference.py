"""The oracle for lltm.LLTM's nn.LSTM conventions: a Python loop of
reference cells (lltm.reference.lltm_cell), run row by row and direction by
direction, each row over its own length."""
import torch

from lltm import reference


def reference_lltm(m, x, h0=None, c0=None, lengths=None, layer_inputs=None):
    """m: an lltm.LLTM (its parameters are used); x [T, B, I] time-major;
    h0, c0 [D*L, B, H] or None (zeros); lengths: B ints or None (all T).
    Returns (output [T, B, D*H], zero beyond each row's length, h_n, c_n).
    layer_inputs: optional {k: tensor} replacing layer k's input (dropout)."""
    T, B, _ = x.shape
    D, L, H = m.num_directions, m.num_layers, m.hidden_size
    if h0 is None:
        h0 = c0 = x.new_zeros(D * L, B, H)
    lengths = [T] * B if lengths is None else [int(n) for n in lengths]
    layer_in, h_n, c_n = x, [], []
    for k in range(L):
        if layer_inputs and k in layer_inputs:
            layer_in = layer_inputs[k]
        outs = []
        for d in range(D):
            weights, bias = m.layer_parameters(k, reverse=d == 1)
            if bias is None:
                bias = weights.new_zeros(weights.shape[0])
            rows, hs, cs = [], [], []
            for b in range(B):
                n = lengths[b]
                h, c = h0[k * D + d, b:b + 1], c0[k * D + d, b:b + 1]
                steps = [None] * T
                for t in (range(n) if d == 0 else reversed(range(n))):
                    h, c = reference.lltm_cell(layer_in[t, b:b + 1], weights, bias, h, c)
                    steps[t] = h[0]
                zero = x.new_zeros(H)
                rows.append(torch.stack([zero if s is None else s for s in steps]))
                hs.append(h[0])
                cs.append(c[0])
            outs.append(torch.stack(rows, dim=1))
            h_n.append(torch.stack(hs))
            c_n.append(torch.stack(cs))
        layer_in = torch.cat(outs, dim=2)
    return layer_in, torch.stack(h_n), torch.stack(c_n)
