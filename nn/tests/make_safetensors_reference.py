#!/usr/bin/python3
"""Produces the safetensors test data with PyTorch (Debian python3-torch):

  nn/tests/data/pytorch_mlp.safetensors       state dict of a trained Linear(6,5)-ReLU-Linear(5,3), F32
  nn/tests/data/pytorch_mlp_f64.safetensors   the same weights as F64
  nn/tests/data/pytorch_mlp_bf16.safetensors  the same weights rounded to BF16
  nn/tests/data/pytorch_mlp_f16.safetensors   the same weights rounded to F16
  nn/tests/data/safetensors_reference.txt     the model's outputs on fixed inputs, per file

Run once:  /usr/bin/python3 nn/tests/make_safetensors_reference.py
Each line of the text file: <name> <values in row-major order...> (repr of float64).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_format  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def det(shape, k):
    """Deterministic values: sin(0.37 * i + k) for element i in row-major order."""
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)], dtype=torch.float64).reshape(shape)


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x_train = det((8, 6), 0.0).float()
    y_train = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    for _ in range(5):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_train), y_train).backward()
        opt.step()

    x = det((4, 6), 0.5)
    state = model.state_dict()
    lines = []
    for suffix, dtype in [("", torch.float32), ("_f64", torch.float64), ("_bf16", torch.bfloat16),
                          ("_f16", torch.float16)]:
        stored = {name: t.to(dtype) for name, t in state.items()}
        safetensors_format.save(os.path.join(DATA, f"pytorch_mlp{suffix}.safetensors"), stored,
                                {"format": "pt"})
        # gradwire loads BF16 and F16 as float32: the reference computes with those values.
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3)).to(compute)
        m.load_state_dict({name: t.to(compute) for name, t in stored.items()})
        out = m(x.to(compute)).detach()
        lines.append(f"out{suffix or '_f32'} " + " ".join(repr(float(v)) for v in out.reshape(-1).tolist()))
    with open(os.path.join(DATA, "safetensors_reference.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
