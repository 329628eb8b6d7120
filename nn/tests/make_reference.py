#!/usr/bin/python3
"""Produces nn/tests/data/nn_reference.txt with PyTorch (Debian python3-torch).

Run once:  /usr/bin/python3 nn/tests/make_reference.py > nn/tests/data/nn_reference.txt
The C++ test rebuilds the same inputs (deterministic formulas below) and compares.
Each line: <name> <values in row-major order...> (float64).
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


# MLP 5 -> 4 -> 3 with ReLU and Tanh, cross-entropy on 6 samples.
x = det((6, 5), 0.0)
w1 = det((4, 5), 1.0).requires_grad_()
b1 = det((4,), 2.0).requires_grad_()
w2 = det((3, 4), 3.0).requires_grad_()
b2 = det((3,), 4.0).requires_grad_()
targets = torch.tensor([0, 2, 1, 1, 0, 2])
h = torch.tanh(torch.relu(x @ w1.T + b1))
logits = h @ w2.T + b2
loss = torch.nn.functional.cross_entropy(logits, targets)
loss.backward()
emit("mlp.loss", loss)
for name, p in [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]:
    emit("mlp.grad." + name, p.grad)

# Cross-entropy with sum reduction, and MSE.
z = det((4, 7), 5.0).requires_grad_()
t = torch.tensor([6, 0, 3, 3])
l = torch.nn.functional.cross_entropy(z, t, reduction="sum")
l.backward()
emit("ce_sum.loss", l)
emit("ce_sum.grad", z.grad)
a = det((3, 4), 6.0).requires_grad_()
b = det((3, 4), 7.0)
m = torch.nn.functional.mse_loss(a, b)
m.backward()
emit("mse.loss", m)
emit("mse.grad", a.grad)

# EmbeddingBag sum and mean with offsets (including an empty bag) and a weighted loss.
for mode in ["sum", "mean"]:
    w = det((10, 3), 8.0).requires_grad_()
    ids = torch.tensor([1, 4, 4, 9, 0, 2, 7])
    offsets = torch.tensor([0, 3, 3, 5])
    out = torch.nn.functional.embedding_bag(ids, w, offsets, mode=mode)
    (out * det(tuple(out.shape), 9.0)).sum().backward()
    emit(f"bag_{mode}.out", out)
    emit(f"bag_{mode}.grad", w.grad)
