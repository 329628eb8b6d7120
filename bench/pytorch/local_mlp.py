#!/usr/bin/python3
"""Benchmark `local_mlp` on PyTorch: W5's model in one process (see BENCHMARKS.md).

Linear 1024-1024-1024-1024-10 with ReLUs, batch 128, cross-entropy, SGD lr 0.01;
one step = zero_grad + forward + backward + step. One thread. Prints result lines in
the format `workload=local_mlp impl=pytorch metric=... value=... unit=...`.
"""
import statistics
import sys
import time

import torch


def blas_core():
    """The kernel family OpenBLAS selected, if torch uses OpenBLAS."""
    try:
        import ctypes
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except OSError:
        return "not OpenBLAS"


def main():
    quick = "--quick" in sys.argv
    warmup, iters = (3, 10) if quick else (10, 50)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 1024)
    y = torch.randint(0, 10, (128,))

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    print(f"local_mlp: {warmup} warm-up + {iters} timed steps (torch {torch.__version__}, "
          f"BLAS core {blas_core()})", file=sys.stderr)
    for _ in range(warmup):
        step()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    print(f"workload=local_mlp impl=pytorch metric=step_ms_median value={statistics.median(ms):.6g} unit=ms")
    print(f"workload=local_mlp impl=pytorch metric=step_ms_p90 value={ms[int(0.9 * len(ms))]:.6g} unit=ms")


if __name__ == "__main__":
    main()
