#!/usr/bin/python3
"""Benchmark W11 `ddp_fashion_mnist` on PyTorch DistributedDataParallel (gloo).

    ddp_fashion_mnist_bench.py [--quick] [--epochs N]

The PyTorch side of gradwire's examples/ddp_fashion_mnist.cc: data-parallel training of
an MLP 784-256-128-10 (ReLU) on Fashion-MNIST, 2 replicas (processes on 127.0.0.1 that
this script starts, one compute thread each: one replica per core), batch 64 per replica,
SGD lr 0.05 momentum 0.9, torch.nn.parallel.DistributedDataParallel over a gloo process
group (its default 25 MB buckets).

- Data as ps_fashion_mnist_bench.py (its loader is reused): replica r trains on the
  examples i with i % 2 == r (gradwire's DataLoader::Shard), reshuffled every epoch from
  its own generator (seed 1 + r), batches of 64, the last of an epoch smaller.
- Model: torch.manual_seed(0) on every replica, torch's default init (DDP broadcasts
  rank 0's anyway), as gradwire's rank-0 initialisation draws from the same
  distribution.
- Evaluation, as gradwire's example: every 200 steps and at the end of every epoch both
  replicas compute the test accuracy on the 10,000 test images (the same parameters, so
  both decide alike); evaluation time is not counted.
- time_to_85: training seconds (evaluation excluded) until the first evaluation at or
  above 0.85; steps_to_85: steps per replica until then; samples_per_s: samples of both
  replicas up to then / time_to_85; final_test_acc: the last evaluation. The run stops
  at 85% or after --epochs (default 10; --quick: 1).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ps_fashion_mnist_bench import load  # noqa: E402  (runs nothing on import)
import rpc_bench  # noqa: E402  (runs nothing on import)
from rpc_bench import line  # noqa: E402

REPLICAS = 2
BATCH = 64
EVAL_EVERY = 200
DEADLINE_S = 900


def replica(rank, epochs):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=REPLICAS, timeout=datetime.timedelta(seconds=120))
    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    mine = torch.arange(rank, len(train_x), REPLICAS)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    shuffle = torch.Generator().manual_seed(1 + rank)
    trained = 0.0
    steps = samples = 0
    test_acc, time_to_85, steps_to_85, samples_to_85 = 0.0, None, None, 0

    def evaluate():
        nonlocal test_acc, time_to_85, steps_to_85, samples_to_85
        with torch.no_grad():
            test_acc = (ddp(test_x).argmax(1) == test_y).float().mean().item()
        if time_to_85 is None and test_acc >= 0.85:
            time_to_85, steps_to_85, samples_to_85 = trained, steps, samples
        return time_to_85 is not None

    done = False
    for epoch in range(epochs):
        order = mine[torch.randperm(len(mine), generator=shuffle)]
        for start in range(0, len(order), BATCH):
            idx = order[start:start + BATCH]
            x, y = train_x[idx], train_y[idx]
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            trained += time.perf_counter() - t0
            steps += 1
            samples += REPLICAS * len(idx)
            if steps % EVAL_EVERY == 0 and evaluate():
                done = True
                break
        if done or evaluate():
            break
        if rank == 0:
            print(f"ddp_fashion_mnist: epoch {epoch + 1}: test_acc={test_acc:.4f} {trained:.2f} s", file=sys.stderr)
    if rank == 0:
        print(line("ddp_fashion_mnist", "time_to_85", time_to_85 if time_to_85 is not None else float("nan"), "s"))
        print(line("ddp_fashion_mnist", "steps_to_85", steps_to_85 if steps_to_85 is not None else float("nan"),
                   "steps"))
        print(line("ddp_fashion_mnist", "samples_per_s",
             samples_to_85 / time_to_85 if time_to_85 else samples / trained, "samples/s"))
        print(line("ddp_fashion_mnist", "final_test_acc", test_acc, "fraction"))
        sys.stdout.flush()
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    epochs = 1 if "--quick" in args else 10
    if "--epochs" in args:
        epochs = int(args[args.index("--epochs") + 1])
    if "--rank" in args:  # a replica, started below
        replica(int(args[args.index("--rank") + 1]), epochs)
        return
    procs = rpc_bench.start_pair(args, rpc_bench.child_env(), script=__file__, world_size=REPLICAS)
    why = rpc_bench.wait_pair(procs, DEADLINE_S)
    if why:
        print(f"ddp_fashion_mnist_bench: {why}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
