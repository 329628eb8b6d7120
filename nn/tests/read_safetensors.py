#!/usr/bin/python3
"""Reads a safetensors file with PyTorch and prints what it holds, for safetensors_test.cc:

  meta <key> <value>                         one line per __metadata__ entry
  <name> <DTYPE> [d0,d1,...] <values...>     one line per tensor (values as repr of float)

Exits with 77 when PyTorch is not installed (the test is then skipped).
"""
import os
import sys

try:
    import torch
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_format  # noqa: E402

tensors, metadata = safetensors_format.load(sys.argv[1])
for key, value in sorted(metadata.items()):
    print("meta", key, value)
for name, t in sorted(tensors.items()):
    values = " ".join(repr(float(v)) for v in t.reshape(-1).to(torch.float64).tolist())
    print(name, safetensors_format.DTYPES[t.dtype], "[" + ",".join(str(d) for d in t.shape) + "]", values)
