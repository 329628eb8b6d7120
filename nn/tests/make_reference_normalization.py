#!/usr/bin/python3
"""Produces nn/tests/data/normalization_reference.txt with PyTorch (Debian python3-torch).

Run once:
  /usr/bin/python3 nn/tests/make_reference_normalization.py > nn/tests/data/normalization_reference.txt
The C++ test (normalization_test.cc) rebuilds the same modules and inputs and compares.
Each line: <name> <values in row-major order...> (float64).

Every case runs a module on inputs det(shape, k) (a permuted view of one where the name
says "strided"), with its parameters set to det(...) and the output's gradient det(out, 9),
for two training steps and one eval step, and records the outputs, the gradients of input
and parameters (zeroed between steps) and the buffers after each step.
"""
import math
import torch

torch.set_default_dtype(torch.float64)


def det(shape, k):
    """Deterministic values: sin(0.37 * i + k) for element i in row-major order."""
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)]).reshape(shape)


def emit(name, t):
    t = t.detach().reshape(-1) if t.dim() > 0 else t.detach().reshape(1)
    print(name, " ".join(repr(float(v)) for v in t.tolist()))


def make_input(shape, k, perm):
    """det(shape, k), or with perm a permuted view of det of the permuted-back shape."""
    if perm is None:
        return det(shape, k).requires_grad_()
    base_shape = [0] * len(shape)
    for i, p in enumerate(perm):
        base_shape[p] = shape[i]
    leaf = det(tuple(base_shape), k).requires_grad_()
    return leaf, leaf.permute(*perm)


def run(name, module, shape, perm=None):
    for p_name, p in module.named_parameters():
        with torch.no_grad():
            p.copy_(det(tuple(p.shape), 1.0 if p_name == "weight" else 2.0))
    for step, (train, k) in enumerate([(True, 0.0), (True, 3.0), (False, 6.0)]):
        module.train(train)
        module.zero_grad()
        if perm is None:
            leaf = x = make_input(shape, k, None)
        else:
            leaf, x = make_input(shape, k, perm)
        out = module(x)
        out.backward(det(tuple(out.shape), 9.0))
        prefix = f"{name}.{step}"
        emit(prefix + ".out", out)
        emit(prefix + ".grad.input", leaf.grad)
        for p_name, p in module.named_parameters():
            emit(f"{prefix}.grad.{p_name}", p.grad)
        for b_name, b in module.named_buffers():
            emit(f"{prefix}.{b_name}", b)


run("bn2d", torch.nn.BatchNorm2d(3), (4, 3, 2, 3))
run("bn2d_strided", torch.nn.BatchNorm2d(3), (4, 3, 2, 3), perm=(3, 1, 0, 2))
run("bn2d_plain", torch.nn.BatchNorm2d(3, affine=False, track_running_stats=False), (2, 3, 3, 2))
run("bn1d", torch.nn.BatchNorm1d(4, momentum=None), (6, 4))
run("bn1d_seq", torch.nn.BatchNorm1d(4, eps=1e-3, momentum=0.3), (3, 4, 5))
run("ln", torch.nn.LayerNorm(6), (2, 3, 6))
run("ln_strided", torch.nn.LayerNorm(6), (2, 3, 6), perm=(1, 2, 0))
run("ln2", torch.nn.LayerNorm((3, 4), elementwise_affine=False), (2, 3, 4))
run("gn", torch.nn.GroupNorm(2, 6), (2, 6, 3, 2))
run("gn_strided", torch.nn.GroupNorm(3, 6, eps=1e-4), (3, 6, 4), perm=(2, 1, 0))
