#!/usr/bin/python3
"""Benchmark the model-zoo training steps on PyTorch (W16-W18, see BENCHMARKS.md).

    models_bench.py [--quick] cnn|resnet|lstm|vit

One step = zero_grad + forward + loss + backward + SGD(momentum 0.9) step, batch 64 of
28x28 single-channel images, one thread, on the models of gradwire's models/ folder
(written in PyTorch in bench/pytorch/zoo.py): cnn (NLL loss on its log-probabilities),
resnet, lstm, vit (cross-entropy).
Prints `workload=<w> impl=pytorch metric=step_ms_median value=... unit=ms`.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from zoo import MODELS

WORKLOAD = {"cnn": "cnn_step", "resnet": "resnet_step", "lstm": "lstm_step", "vit": "vit_step"}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    if len(args) != 1 or args[0] not in MODELS:
        sys.exit(f"usage: models_bench.py [--quick] {'|'.join(MODELS)}")
    name = args[0]
    warmup, iters = (2, 5) if quick else (5, 30)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MODELS[name]()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    loss_fn = F.nll_loss if name == "cnn" else F.cross_entropy

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    print(f"{WORKLOAD[name]}: {warmup} warm-up + {iters} timed steps (torch {torch.__version__}, "
          f"mkldnn {torch.backends.mkldnn.is_available()})", file=sys.stderr)
    for _ in range(warmup):
        step()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    w = WORKLOAD[name]
    print(f"workload={w} impl=pytorch metric=step_ms_median value={statistics.median(ms):.6g} unit=ms")
    print(f"workload={w} impl=pytorch metric=step_ms_p90 value={ms[int(0.9 * len(ms))]:.6g} unit=ms")


if __name__ == "__main__":
    main()
