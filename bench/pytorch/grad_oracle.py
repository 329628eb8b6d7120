#!/usr/bin/python3
"""Benchmark W8 `grad_oracle` on PyTorch (see BENCHMARKS.md): the two-worker
model of dist_autograd/tests/make_reference.py under torch.distributed.autograd, compared
with the same model run locally. Prints the loss and the largest difference.

    grad_oracle.py [--quick]        (--quick changes nothing: the run is already short)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "dist_autograd", "tests"))
import make_reference  # noqa: E402

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "--bench"]
    make_reference.rpc_bench.run_main(make_reference.main, "grad_oracle")
