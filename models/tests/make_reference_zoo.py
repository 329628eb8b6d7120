#!/usr/bin/python3
"""Produces models/tests/data/zoo_reference.txt with PyTorch (Debian python3-torch).

Run once:  /usr/bin/python3 models/tests/make_reference_zoo.py > models/tests/data/zoo_reference.txt
The models are bench/pytorch/zoo.py's (the zoo written in PyTorch). For each model, in
float64, the C++ test (zoo_test.cc) rebuilds everything from the same formulas:
  - every state-dict entry, in PyTorch's order, gets deterministic values (Fill below);
    the file lists each key with its shape, so key names, order and shapes are checked too;
  - a batch of 4 images det([4, 1, 28, 28], 0.5), targets 0, 1, 2, 3;
  - train mode (batch statistics) with dropout off (Dropout modules and attention, whose
    weights' dropout follows its module's mode, in eval); the loss (NLL on the CNN's
    log-probabilities, cross-entropy otherwise), backward.
Lines (name, then values): <m>.key.<entry> <shape...>, <m>.out <logits>, <m>.loss,
<m>.grad.<param> <sum> <sum of |g|> <first 8 values>, <m>.running.<buffer> <values...>
(BatchNorm statistics after the step), <m>.eval_out <logits in eval mode afterwards>.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench", "pytorch"))
from zoo import MODELS  # noqa: E402

torch.set_default_dtype(torch.float64)


def det(shape, k):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)]).reshape(shape)


def fill(name, shape, i):
    """The value of state-dict entry number i (see zoo_test.cc's Fill)."""
    if name.endswith("num_batches_tracked"):
        return torch.zeros(shape, dtype=torch.int64)
    if name.endswith("running_var"):
        return 1 + 0.5 * det(shape, i)
    if len(shape) >= 2:
        return det(shape, i) / math.sqrt(math.prod(shape[1:]))
    return 0.1 * det(shape, i)


def emit(name, values):
    print(name, " ".join(repr(float(v)) for v in values))


for key, cls in MODELS.items():
    torch.manual_seed(0)
    model = cls()
    state = model.state_dict()
    for i, (name, t) in enumerate(state.items()):
        emit(f"{key}.key.{name}", list(t.shape))
        with torch.no_grad():
            t.copy_(fill(name, list(t.shape), i))
    model.train()
    for m in model.modules():
        if isinstance(m, (torch.nn.Dropout, torch.nn.Dropout2d, torch.nn.MultiheadAttention)):
            m.eval()  # dropout off (attention's dropout is its module's training flag)
    x = det([4, 1, 28, 28], 0.5)
    y = torch.tensor([0, 1, 2, 3])
    out = model(x)
    loss = (torch.nn.functional.nll_loss if key == "cnn" else torch.nn.functional.cross_entropy)(out, y)
    loss.backward()
    emit(f"{key}.out", out.detach().reshape(-1).tolist())
    emit(f"{key}.loss", [loss.item()])
    for name, p in model.named_parameters():
        g = p.grad.reshape(-1)
        emit(f"{key}.grad.{name}", [g.sum().item(), g.abs().sum().item()] + g[:8].tolist())
    for name, b in model.named_buffers():
        if "running" in name:
            emit(f"{key}.running.{name}", b.reshape(-1).tolist())
    model.eval()
    with torch.no_grad():
        emit(f"{key}.eval_out", model(x).reshape(-1).tolist())
