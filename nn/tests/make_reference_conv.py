#!/usr/bin/python3
"""Produces nn/tests/data/conv_reference.txt with PyTorch (Debian python3-torch).

Run once:  /usr/bin/python3 nn/tests/make_reference_conv.py > nn/tests/data/conv_reference.txt
For every case and dtype (float32, float64): the layer's weight and bias are det(shape, 1)
and det(shape, 2), the input det(shape, 3); the loss is sum(output * det(out_shape, 4)).
Lines: <case>.<dtype>.<out|gx|gw|gb> followed by the values in row-major order, or, for
tensors of more than 120 elements, <...>.proj followed by sum(t * det(shape, 5)) and
sum(|t|). The C++ test (conv_reference_test.cc) rebuilds the same inputs.
"""
import math
import torch
import torch.nn as nn


def det(shape, k, dtype):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)], dtype=torch.float64).reshape(shape).to(dtype)


def emit(name, t):
    t = t.detach()
    if t.numel() > 120:
        w = det(tuple(t.shape), 5.0, torch.float64)
        t64 = t.double()
        print(name + ".proj", repr(float((t64 * w).sum())), repr(float(t64.abs().sum())))
    else:
        print(name, " ".join(repr(float(v)) for v in t.reshape(-1).tolist()))


# name, module factory, input shape
CASES = [
    ("conv1d", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), (2, 4, 11)),
    ("conv2d", lambda: nn.Conv2d(3, 4, 3), (2, 3, 6, 7)),
    ("conv2d_sdpg", lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2), dilation=(2, 1), groups=2),
     (2, 4, 8, 7)),
    ("conv2d_nobias", lambda: nn.Conv2d(2, 3, 1, stride=2, bias=False), (1, 2, 5, 5)),
    ("conv2d_wide", lambda: nn.Conv2d(32, 32, 3, padding=1), (16, 32, 12, 12)),
    ("convt2d", lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
     (2, 4, 4, 5)),
    ("convt2d_dil", lambda: nn.ConvTranspose2d(3, 2, (2, 3), stride=(1, 2), dilation=(2, 1), bias=False),
     (1, 3, 4, 4)),
    ("maxpool", lambda: nn.MaxPool2d(2), (2, 3, 6, 6)),
    ("maxpool_ceil", lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 9, 8)),
    ("maxpool_dil", lambda: nn.MaxPool2d((2, 3), stride=(2, 1), padding=1, dilation=(1, 2)), (1, 2, 7, 8)),
    ("avgpool", lambda: nn.AvgPool2d(2), (2, 3, 6, 6)),
    ("avgpool_ceil_incl", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), (2, 3, 8, 9)),
    ("avgpool_ceil_excl", lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
     (2, 3, 8, 9)),
    ("adaptive_7_3", lambda: nn.AdaptiveAvgPool2d(3), (2, 3, 7, 7)),
    ("adaptive_28_1", lambda: nn.AdaptiveAvgPool2d(1), (2, 3, 28, 28)),
]

for dtype, dname in [(torch.float32, "f32"), (torch.float64, "f64")]:
    for name, make, in_shape in CASES:
        m = make().to(dtype)
        with torch.no_grad():
            if hasattr(m, "weight"):
                m.weight.copy_(det(tuple(m.weight.shape), 1.0, dtype))
                if m.bias is not None:
                    m.bias.copy_(det(tuple(m.bias.shape), 2.0, dtype))
        x = det(in_shape, 3.0, dtype).requires_grad_()
        out = m(x)
        (out * det(tuple(out.shape), 4.0, dtype)).sum().backward()
        prefix = f"{name}.{dname}"
        emit(prefix + ".out", out)
        emit(prefix + ".gx", x.grad)
        if hasattr(m, "weight"):
            emit(prefix + ".gw", m.weight.grad)
            if m.bias is not None:
                emit(prefix + ".gb", m.bias.grad)
