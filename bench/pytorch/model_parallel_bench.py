#!/usr/bin/python3
"""Benchmark W5 `model_parallel_mlp` on PyTorch RPC (see BENCHMARKS.md).

    model_parallel_bench.py [--quick]

torch.distributed.rpc with the TensorPipe backend, set up exactly as rpc_bench.py
(its launcher helpers and TensorPipe probe are reused from there): two worker
processes on 127.0.0.1 that this script starts itself (`--rank 0|1`, a free
MASTER_PORT each run), one compute thread in each.

The model is local_mlp's: Linear 1024-1024-1024-1024-10 with ReLUs, float32, built
from torch.manual_seed(0) in each worker; worker 0 keeps Linear(1024,1024)+ReLU+
Linear(1024,1024)+ReLU, worker 1 keeps Linear(1024,1024)+ReLU+Linear(1024,10) as an
nn.Sequential created with rpc.remote (an RRef owned by worker 1) and called through
it (rref.rpc_sync().forward(h)). Batch 128 random inputs and labels (seed 1),
cross-entropy loss on worker 0. One iteration = `with dist_autograd.context()`:
forward, dist_autograd.backward(ctx, [loss]), DistributedOptimizer(SGD, lr 0.01)
.step(ctx); the optimizer is built once over RRefs of worker 0's parameters and of
worker 1's (returned by an rpc to worker 1). 5 warm-up + 50 timed iterations:
dist_ms_per_iter_median and _p90 (ms). Then, in worker 0, the same model whole in one
process (zero_grad, forward, loss.backward(), torch.optim.SGD step; same counts):
local_ms_per_iter_median and _p90 (ms); dist_overhead_ms = dist median - local median.
Both runs start from the same weights and see the same batch, so their losses must
follow the same trajectory; the run fails if they part by more than LOSS_RTOL.

--quick: 2 warm-up + 5 timed (smoke test); metric names stay the same.
Result lines go to stdout from worker 0 only, in the format
`workload=model_parallel_mlp impl=pytorch metric=... value=... unit=...`, after
rpc.shutdown(). Every loop is bounded; a watchdog in each worker and a deadline in the
launcher end a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from local_mlp import blas_core  # noqa: E402  (runs nothing on import)
from rpc_bench import line, percentile  # noqa: E402

WORKLOAD = "model_parallel_mlp"
WORLD_SIZE = rpc_bench.WORLD_SIZE
RPC_TIMEOUT_S = rpc_bench.RPC_TIMEOUT_S
DEADLINE_S = {False: 300, True: 180}   # whole benchmark, by --quick
ITERS = {False: (5, 50), True: (2, 5)}   # (warm-up, timed), by --quick
BATCH, WIDTH, CLASSES = 128, 1024, 10
SPLIT = 4            # worker 0 holds full_model()[:SPLIT], worker 1 the rest
LR = 0.01
LOSS_RTOL = 1e-4     # dist vs local loss, every iteration (float32, same kernels)


def usage(msg):
    print(f"model_parallel_bench: {msg}\nusage: model_parallel_bench.py [--quick]",
          file=sys.stderr)
    sys.exit(2)


def full_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, CLASSES))


# ---------------------------------------------------------------- remote functions
# Module-level so worker 1 resolves them by name (both workers run this file as __main__).

def make_stage1():
    return full_model()[SPLIT:]


def param_rrefs(module_rref):
    import torch.distributed.rpc as rpc
    return [rpc.RRef(p) for p in module_rref.local_value().parameters()]


# ---------------------------------------------------------------- worker side

def timed(step, warmup, iters):
    """Runs step() warmup + iters times; (sorted ms of the timed ones, every loss)."""
    losses = [step() for _ in range(warmup)]
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        losses.append(step())
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return ms, losses


def bench_dist(torch, rpc, x, y, warmup, iters):
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer
    stage0 = full_model()[:SPLIT]
    stage1 = rpc.remote("worker1", make_stage1)
    params = [rpc.RRef(p) for p in stage0.parameters()]
    params += rpc.rpc_sync("worker1", param_rrefs, args=(stage1,))
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=LR)
    print(f"{WORKLOAD}: dist: {len(params)} parameter RRefs; {warmup} warm-up + {iters} "
          f"timed iterations", file=sys.stderr)

    def step():
        with dist_autograd.context() as ctx:
            logits = stage1.rpc_sync().forward(stage0(x))
            loss = torch.nn.functional.cross_entropy(logits, y)
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        return loss.item()

    return timed(step, warmup, iters)


def bench_local(torch, x, y, warmup, iters):
    model = full_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    print(f"{WORKLOAD}: local: {warmup} warm-up + {iters} timed iterations", file=sys.stderr)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return timed(step, warmup, iters)


def run(torch, rpc, quick):
    print(f"{WORKLOAD}: BLAS core {blas_core()} (OPENBLAS_CORETYPE="
          f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')})", file=sys.stderr)
    warmup, iters = ITERS[quick]
    torch.manual_seed(1)
    x = torch.randn(BATCH, WIDTH)
    y = torch.randint(0, CLASSES, (BATCH,))
    dist_ms, dist_losses = bench_dist(torch, rpc, x, y, warmup, iters)
    local_ms, local_losses = bench_local(torch, x, y, warmup, iters)
    worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(dist_losses, local_losses))
    print(f"{WORKLOAD}: loss first {dist_losses[0]:.6g} last {dist_losses[-1]:.6g} "
          f"(local {local_losses[0]:.6g} .. {local_losses[-1]:.6g}); largest relative "
          f"difference dist/local {worst:.3g}", file=sys.stderr)
    if not worst <= LOSS_RTOL:
        raise RuntimeError(f"dist and local losses part by {worst:.3g} (relative), more than "
                           f"{LOSS_RTOL:g}: the distributed step does not train like the local one")
    dist_med, local_med = statistics.median(dist_ms), statistics.median(local_ms)
    print(f"{WORKLOAD}: dist median {dist_med:.4g} ms (min {dist_ms[0]:.4g}, max "
          f"{dist_ms[-1]:.4g}); local median {local_med:.4g} ms (min {local_ms[0]:.4g}, max "
          f"{local_ms[-1]:.4g})", file=sys.stderr)
    return [line(WORKLOAD, "dist_ms_per_iter_median", dist_med, "ms"),
            line(WORKLOAD, "dist_ms_per_iter_p90", percentile(dist_ms, 0.90), "ms"),
            line(WORKLOAD, "local_ms_per_iter_median", local_med, "ms"),
            line(WORKLOAD, "local_ms_per_iter_p90", percentile(local_ms, 0.90), "ms"),
            line(WORKLOAD, "dist_overhead_ms", dist_med - local_med, "ms")]


def worker(rank, quick):
    rpc_bench.run_worker(rank, DEADLINE_S[quick], lambda torch, rpc: run(torch, rpc, quick))


# ---------------------------------------------------------------- launcher side

def launch(quick):
    q = ["--quick"] if quick else []
    return rpc_bench.launch_pair(__file__, " ".join(["model_parallel_bench"] + q), q, DEADLINE_S[quick])


def main():
    return rpc_bench.quick_main(sys.argv[1:], launch, worker, usage)


if __name__ == "__main__":
    rpc_bench.run_main(main, "model_parallel_bench")
