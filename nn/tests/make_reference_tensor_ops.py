#!/usr/bin/python3
"""Produces nn/tests/data/tensor_ops_reference.txt with PyTorch (Debian python3-torch 1.13).

Run once:
  /usr/bin/python3 nn/tests/make_reference_tensor_ops.py > nn/tests/data/tensor_ops_reference.txt
The C++ test (nn/tests/tensor_ops_test.cc) rebuilds the same inputs and compares.
Each line: <name> <values in row-major order...>. Every case runs in float64 and float32
(names end in .f64 / .f32); gradients are of sum(out * det(out.shape, 9.0)).
"""
import math
import torch


def det(shape, k, dtype):
    """Deterministic values: sin(0.37 * i + k) for element i in row-major order."""
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)],
                        dtype=torch.float64).reshape(shape).to(dtype)


def emit(name, t):
    t = t.detach().to(torch.float64).reshape(-1)
    print(name, " ".join(repr(float(v)) for v in t.tolist()))


def case(name, fn, shapes, dtype, suffix):
    """out = fn(*inputs) for inputs det(shape, 1 + i); emits out and each input's gradient."""
    inputs = [det(s, 1.0 + i, dtype).requires_grad_() for i, s in enumerate(shapes)]
    out = fn(*inputs)
    (out * det(tuple(out.shape), 9.0, dtype)).sum().backward()
    emit(f"{name}.out.{suffix}", out)
    for i, x in enumerate(inputs):
        emit(f"{name}.grad{i}.{suffix}", x.grad)


F = torch.nn.functional
# Inputs scaled to [-3, 3] where the function's shape matters there.
CASES = [
    ("gelu", lambda x: F.gelu(3 * x), [(4, 5)]),
    ("gelu_tanh", lambda x: F.gelu(3 * x, approximate="tanh"), [(4, 5)]),
    ("silu", lambda x: F.silu(3 * x), [(4, 5)]),
    ("erf", lambda x: torch.erf(2 * x), [(4, 5)]),
    ("var_dim1", lambda x: torch.var(x, dim=1), [(3, 4, 5)]),
    ("var_dims_keepdim_c0", lambda x: torch.var(x, dim=(0, 2), correction=0, keepdim=True),
     [(3, 4, 5)]),
    ("var_all", lambda x: torch.var(x), [(3, 4)]),
    ("gather_dim1", lambda x: torch.gather(x, 1, torch.tensor([[2, 0, 2], [1, 1, 0], [0, 3, 3]])),
     [(3, 4)]),
    ("gather_dim0", lambda x: torch.gather(x, 0, torch.tensor([[2, 0, 1, 2], [1, 1, 0, 0]])),
     [(3, 4)]),
    ("masked_fill", lambda x: x.masked_fill(torch.tensor([True, False, True, False, False]), -2.5),
     [(3, 5)]),
    ("where", lambda a, b: torch.where(torch.tensor([[True], [False], [True]]), a, b),
     [(3, 4), (4,)]),
    ("matmul_bcast", lambda a, b: a @ b, [(2, 1, 3, 4), (5, 4, 6)]),
    ("matmul_batch_mat", lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    ("matmul_mat_batch", lambda a, b: a @ b, [(3, 4), (2, 4, 5)]),
    ("matmul_transposed", lambda a, b: a.transpose(-1, -2) @ b.transpose(-1, -2),
     [(3, 4, 2), (1, 5, 4)]),
    ("log_softmax_dim0", lambda x: F.log_softmax(x.transpose(0, 1), dim=0), [(3, 4)]),
]

for dtype, suffix in [(torch.float64, "f64"), (torch.float32, "f32")]:
    for name, fn, shapes in CASES:
        case(name, fn, shapes, dtype, suffix)
