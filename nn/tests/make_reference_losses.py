#!/usr/bin/python3
"""Produces nn/tests/data/losses_reference.txt with PyTorch (Debian python3-torch).

Run once:  /usr/bin/python3 nn/tests/make_reference_losses.py > nn/tests/data/losses_reference.txt
The C++ test (loss_reference_test.cc) rebuilds the same inputs and compares. Each line:
<name> <values in row-major order...> (float64). For each case: <case>.loss and the gradients
<case>.grad (and <case>.grad_target for MSE) of sum(loss * det(loss.shape, 9)) (a scalar loss
is backpropagated as it is).
"""
import math

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def det(shape, k):
    """Deterministic values: sin(0.37 * i + k) for element i in row-major order."""
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)]).reshape(shape)


def emit(name, t):
    t = t.detach().reshape(-1)
    print(name, " ".join(repr(float(v)) for v in t.tolist()))


def run(name, fn, *inputs):
    inputs = [x.clone().requires_grad_() for x in inputs]
    loss = fn(*inputs)
    (loss if loss.dim() == 0 else (loss * det(tuple(loss.shape), 9.0)).sum()).backward()
    emit(name + ".loss", loss)
    emit(name + ".grad", inputs[0].grad)
    if len(inputs) > 1:
        emit(name + ".grad_target", inputs[1].grad)


weight4 = 1 + 0.5 * det((4,), 2.0)
weight3 = 1 + 0.5 * det((3,), 4.0)
x2 = det((5, 4), 1.0)
t2 = torch.tensor([0, 3, -100, 1, 3])
x4 = det((2, 3, 2, 2), 3.0)
t4 = torch.tensor([0, 2, 1, 1, 2, 0, 1, 0]).reshape(2, 2, 2)

for reduction in ["mean", "sum", "none"]:
    run(f"nll_{reduction}", lambda x: F.nll_loss(x, t2, weight=weight4, reduction=reduction), x2)
    run(f"ce_{reduction}",
        lambda x: F.cross_entropy(x, t2, weight=weight4, reduction=reduction, label_smoothing=0.1), x2)
    run(f"mse_{reduction}", lambda a, b: F.mse_loss(a, b, reduction=reduction), det((3, 4), 6.0), det((3, 4), 7.0))
run("nll_4d", lambda x: F.nll_loss(x, t4, ignore_index=1), x4)
run("ce_4d", lambda x: F.cross_entropy(x, t4, weight=weight3, ignore_index=2, label_smoothing=0.2), x4)
run("ce_4d_none", lambda x: F.cross_entropy(x, t4, reduction="none"), x4)
run("ce_smooth_unweighted", lambda x: F.cross_entropy(x, t2, label_smoothing=0.3), x2)
run("ce_unbatched", lambda x: F.cross_entropy(x, torch.tensor(2), label_smoothing=0.1), det((4,), 5.0))
