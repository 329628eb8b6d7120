#!/usr/bin/python3
"""Benchmark W10 `allreduce` on torch.distributed with the gloo backend (see BENCHMARKS.md).

    allreduce_bench.py [--quick]

For n = 2 and 4 processes on 127.0.0.1 (started by this script, a free MASTER_PORT each
time, one compute thread each): dist.all_reduce (sum) of a float32 tensor of 4 KiB,
1 MiB and 64 MiB; 20 warm-up, then 200 / 50 / 10 timed (--quick: 5 warm-up, 20 / 10 / 3),
each right after a dist.barrier(), timed on rank 0 as gradwire's bench_collectives does.
Rank 0 prints `workload=allreduce impl=pytorch metric=allreduce_w<n>_<size>_ms_median`
and `..._busbw` (GB/s, NCCL-tests' bus bandwidth: bytes / time x 2(n-1)/n).
Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)

SIZES = (("4KiB", 4 << 10, 200, 20), ("1MiB", 1 << 20, 50, 10), ("64MiB", 64 << 20, 10, 3))
DEADLINE_S = 600


def member(rank, n, quick):
    import datetime
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))
    for name, nbytes, timed, timed_quick in SIZES:
        numel = nbytes // 4
        t = torch.full((numel,), float(rank + 1))
        dist.all_reduce(t)
        if t[-1].item() != n * (n + 1) / 2:
            print("allreduce_bench: wrong allreduce result", file=sys.stderr)
            sys.exit(1)
        t = torch.zeros(numel)
        warmup = 5 if quick else 20
        iters = timed_quick if quick else timed
        ms = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= warmup:
                ms.append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            median = statistics.median(ms)
            busbw = nbytes / (median * 1e-3) * 2.0 * (n - 1) / n / 1e9
            print(f"workload=allreduce impl=pytorch metric=allreduce_w{n}_{name}_ms_median value={median:.6g} unit=ms",
                  flush=True)
            print(f"workload=allreduce impl=pytorch metric=allreduce_w{n}_{name}_busbw value={busbw:.6g} unit=GB/s",
                  flush=True)
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    if "--rank" in args:  # a member, started below
        member(int(args[args.index("--rank") + 1]), int(os.environ["GW_ALLREDUCE_N"]), quick)
        return
    for n in (2, 4):
        print(f"allreduce: torch.distributed gloo, {n} processes{', quick' if quick else ''}", file=sys.stderr)
        procs = rpc_bench.start_pair(args, rpc_bench.child_env({"GW_ALLREDUCE_N": str(n)}), script=__file__,
                                     world_size=n)
        why = rpc_bench.wait_pair(procs, DEADLINE_S)
        if why:
            print(f"allreduce_bench: {why}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
