#!/usr/bin/python3
"""Produces nn/tests/data/attention_reference.txt with PyTorch 1.13 (Debian python3-torch).

Run once:
  /usr/bin/python3 nn/tests/make_reference_attention.py > nn/tests/data/attention_reference.txt
The C++ test (attention_test.cc) rebuilds the same modules and inputs and compares.
Each line: <name> <values in row-major order...> (float64).

Every case sets the module's i-th parameter (named_parameters order) to det(shape, 1 + i/2),
runs it on inputs det(shape, 3 + j) (input j; a permuted view of a leaf where a case gives
a permutation; "self" cases pass one tensor as query, key and value), back-propagates
det(out, 9) (and det(weights, 10) when weights are returned) and records the outputs, the
gradients of the input leaves and of every parameter. Dropout is off (p = 0 or eval mode).
"""
import math
import torch
import torch.nn as nn

torch.set_default_dtype(torch.float64)


def det(shape, k):
    """Deterministic values: sin(0.37 * i + k) for element i in row-major order."""
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)]).reshape(shape)


def emit(name, t):
    t = t.detach().reshape(-1) if t.dim() > 0 else t.detach().reshape(1)
    print(name, " ".join(repr(float(v)) for v in t.tolist()))


def make_input(shape, k, perm):
    """A leaf det(...) and the input made from it: itself, or a permuted view of shape `shape`."""
    if perm is None:
        leaf = det(shape, k).requires_grad_()
        return leaf, leaf
    base = [0] * len(shape)
    for i, p in enumerate(perm):
        base[p] = shape[i]
    leaf = det(tuple(base), k).requires_grad_()
    return leaf, leaf.permute(*perm)


def run(name, module, inputs, self_attention=False, **kwargs):
    """inputs: [(shape, perm)]; module(*inputs, **kwargs) returns a tensor or (out, weights)."""
    with torch.no_grad():
        for i, (_, p) in enumerate(module.named_parameters()):
            p.copy_(det(tuple(p.shape), 1.0 + 0.5 * i))
    leaves, xs = [], []
    for j, (shape, perm) in enumerate(inputs):
        leaf, x = make_input(shape, 3.0 + j, perm)
        leaves.append(leaf)
        xs.append(x)
    if self_attention:
        xs = [xs[0]] * 3
    result = module(*xs, **kwargs)
    out, weights = result if isinstance(result, tuple) else (result, None)
    roots, grads = [out], [det(tuple(out.shape), 9.0)]
    if weights is not None:
        roots.append(weights)
        grads.append(det(tuple(weights.shape), 10.0))
    torch.autograd.backward(roots, grads)
    emit(name + ".out", out)
    if weights is not None:
        emit(name + ".weights", weights)
    for j, leaf in enumerate(leaves):
        emit(f"{name}.grad.input{j}", leaf.grad)
    for p_name, p in module.named_parameters():
        emit(f"{name}.grad.{p_name}", p.grad)


def padding(rows):
    return torch.tensor(rows, dtype=torch.bool)


L, S, N, E, H = 3, 4, 2, 4, 2
float_mask = det((L, S), 7.0)
causal_float = nn.Transformer.generate_square_subsequent_mask(L)
causal_bool = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
head_mask = det((N * H, L, L), 8.0)

# MultiheadAttention
run("mha_self", nn.MultiheadAttention(E, H), [((L, N, E), None)], self_attention=True)
run("mha_self_strided", nn.MultiheadAttention(E, H, batch_first=True), [((N, L, E), (1, 2, 0))],
    self_attention=True, key_padding_mask=padding([[False, False, True], [False, False, False]]),
    average_attn_weights=False)
run("mha_cross", nn.MultiheadAttention(E, H), [((L, N, E), None), ((S, N, E), None), ((S, N, E), None)],
    attn_mask=float_mask, key_padding_mask=padding([[False, False, False, True], [True, False, False, False]]))
run("mha_cross_bf", nn.MultiheadAttention(E, H, batch_first=True),
    [((N, L, E), None), ((N, S, E), (0, 2, 1)), ((N, S, E), None)], need_weights=False)
run("mha_causal_float", nn.MultiheadAttention(E, H), [((L, N, E), None)], self_attention=True,
    attn_mask=causal_float)
run("mha_causal_bool", nn.MultiheadAttention(E, H), [((L, N, E), None)], self_attention=True,
    attn_mask=causal_bool, average_attn_weights=False)
run("mha_head_mask", nn.MultiheadAttention(E, H, bias=False), [((L, N, E), None)], self_attention=True,
    attn_mask=head_mask)
run("mha_unbatched", nn.MultiheadAttention(E, H), [((L, E), None), ((S, E), None), ((S, E), None)],
    key_padding_mask=padding([False, True, False, False]))

# TransformerEncoderLayer and TransformerEncoder (dim_feedforward 6)
FF = 6
run("layer_post", nn.TransformerEncoderLayer(E, H, FF, dropout=0.0), [((L, N, E), None)],
    src_key_padding_mask=padding([[False, False, True], [False, False, False]]))
layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.1, activation="gelu", batch_first=True,
                                   norm_first=True)
layer.eval()
run("layer_pre_gelu", layer, [((N, L, E), (1, 0, 2))], src_mask=causal_float)
encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, dropout=0.0), 2,
                                norm=nn.LayerNorm(E))
run("encoder", encoder, [((L, N, E), None)], mask=causal_bool)
