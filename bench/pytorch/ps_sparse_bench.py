#!/usr/bin/python3
"""Benchmark W7 `sparse_embedding_ps` on PyTorch RPC (see BENCHMARKS.md).

    ps_sparse_bench.py [--quick]

torch.distributed.rpc with the TensorPipe backend, set up as ps_dense_bench.py (W6):
three worker processes on 127.0.0.1 that this script starts itself through
rpc_bench.py's launcher helpers, one compute thread in each; worker 0 is the
parameter server, workers 1 and 2 are trainers 0 and 1, each a Trainer object created
with rpc.remote and driven by worker 0 (ps_dense_bench.run_trainers).

- The server object (an RRef owned by worker 0) holds an embedding table
  1,000,000 x 64 float32 (torch.randn, generator seed 0, allocated once). pull(ids)
  returns table.index_select(0, ids); push(ids, grad) applies sparse SGD to those rows,
  table.index_add_(0, ids, grad, alpha=-0.01) (duplicate ids add up). Asynchronous:
  every push is applied when it arrives; a lock makes each pull and push atomic.
- Each trainer, every step: 4096 row ids uniform in [0, 1e6) from its own generator
  (seed 1 + trainer); rows = ps_rref.rpc_sync().pull(ids); then
  ps_rref.rpc_async().push(ids, grad) after waiting for its previous push, so at most
  one push is in flight and it overlaps the next step's pull. grad is a random
  [4096, 64] float32 tensor drawn once per trainer and pushed every step (the loop
  times the parameter server, not torch.randn).
- 5 warm-up steps on both trainers, then 200 timed steps each (wall time on worker 0
  from before the start to both answers, every push acknowledged).
  rows_per_s_sum = 2 trainers * 200 * 4096 * 2 (pulled + pushed) / wall (rows/s);
  step_ms_median = trainer 0's median step (ms, for information).
- Check: the server counts the pulls and pushes, and the table's sum (float64) must
  change by -0.01 * sum over pushes of the pushed gradient's sum, within 1% of one
  push's share (a lost or doubled push, or updates lost to a race, fail the run).

--quick: 20 timed steps (smoke test); metric names stay the same.
Result lines go to stdout from worker 0 only, in the format
`workload=sparse_embedding_ps impl=pytorch metric=... value=... unit=...`, after
rpc.shutdown(). Every loop is bounded; a watchdog in each worker and a deadline in the
launcher end a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import os
import statistics
import sys
import threading
import time

import torch
import torch.distributed.rpc as rpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from ps_dense_bench import TRAINERS, WORLD_SIZE, run_trainers  # noqa: E402
from rpc_bench import line  # noqa: E402

WORKLOAD = "sparse_embedding_ps"
DEADLINE_S = {False: 300, True: 180}   # whole benchmark, by --quick
ITERS = {False: (5, 200), True: (5, 20)}   # (warm-up, timed) steps per trainer
ROWS, DIM = 1_000_000, 64
IDS = 4096                   # rows pulled and pushed per step
LR = 0.01
ID_SEED = 1                  # trainer t draws its ids (and its gradient) from ID_SEED + t
SUM_RTOL = 0.01              # table sum check: tolerance, as a share of one push's


def usage(msg):
    print(f"ps_sparse_bench: {msg}\nusage: ps_sparse_bench.py [--quick]", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- remote objects
# Module-level so every worker resolves them by name (all run this file as __main__).

class EmbeddingServer:
    def __init__(self):
        self.table = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(0))
        self.lock = threading.Lock()
        self.pulls = 0
        self.pushes = 0

    def pull(self, ids):
        with self.lock:
            self.pulls += 1
            return self.table.index_select(0, ids)

    def push(self, ids, grad):
        with self.lock:
            self.table.index_add_(0, ids, grad, alpha=-LR)
            self.pushes += 1


class Trainer:
    def __init__(self, ps_rref, trainer):
        self.ps_rref = ps_rref
        self.gen = torch.Generator().manual_seed(ID_SEED + trainer)
        self.grad = torch.randn(IDS, DIM, generator=self.gen)
        self.pushes = 0

    def train(self, steps):
        """steps asynchronous steps; their durations (ms)."""
        ms = []
        pushed = None
        for _ in range(steps):
            t0 = time.perf_counter()
            ids = torch.randint(0, ROWS, (IDS,), generator=self.gen)
            rows = self.ps_rref.rpc_sync().pull(ids)
            if rows.shape != (IDS, DIM):
                raise RuntimeError(f"pull returned shape {tuple(rows.shape)}")
            if pushed is not None:
                pushed.wait()
            pushed = self.ps_rref.rpc_async().push(ids, self.grad)
            self.pushes += 1
            ms.append((time.perf_counter() - t0) * 1e3)
        if pushed is not None:
            pushed.wait()
        return ms

    def pushed(self):
        """(pushes made, the sum (float64) of the gradient pushed each time)."""
        return self.pushes, self.grad.sum(dtype=torch.float64).item()


# ---------------------------------------------------------------- worker side

def run(quick):
    warmup, iters = ITERS[quick]
    server = EmbeddingServer()
    before = server.table.sum(dtype=torch.float64).item()
    print(f"{WORKLOAD}: table {ROWS} x {DIM} float32; {TRAINERS} trainers, {IDS} ids a step; "
          f"{warmup} warm-up + {iters} timed steps each", file=sys.stderr)
    trainers, wall, ms = run_trainers(Trainer, rpc.RRef(server), warmup, iters)
    steps = TRAINERS * (warmup + iters)
    if server.pulls != steps or server.pushes != steps:
        raise RuntimeError(f"server saw {server.pulls} pulls and {server.pushes} pushes, "
                           f"expected {steps} of each")
    change = server.table.sum(dtype=torch.float64).item() - before
    pushed = [t.rpc_sync().pushed() for t in trainers]
    want = -LR * sum(n * g for n, g in pushed)
    tol = SUM_RTOL * LR * min(abs(g) for _, g in pushed)
    print(f"{WORKLOAD}: wall {wall:.3f} s; trainer step medians "
          f"{', '.join(f'{statistics.median(m):.4g}' for m in ms)} ms; table sum changed by "
          f"{change:.6g}, expected {want:.6g} (off by {abs(change - want):.3g}, tolerance "
          f"{tol:.3g})", file=sys.stderr)
    if not abs(change - want) <= tol:
        raise RuntimeError(f"table sum changed by {change:.6g}, expected {want:.6g}: pushes "
                           f"were lost, doubled or raced")
    rows = 2 * IDS * TRAINERS * iters
    return [line(WORKLOAD, "rows_per_s_sum", rows / wall, "rows/s"),
            line(WORKLOAD, "step_ms_median", statistics.median(ms[0]), "ms")]


def worker(rank, quick):
    rpc_bench.run_worker(rank, DEADLINE_S[quick], lambda torch_, rpc_: run(quick), WORLD_SIZE)


# ---------------------------------------------------------------- launcher side

def launch(quick):
    q = ["--quick"] if quick else []
    return rpc_bench.launch_pair(__file__, " ".join(["ps_sparse_bench"] + q), q,
                                 DEADLINE_S[quick], WORLD_SIZE)


def main():
    return rpc_bench.quick_main(sys.argv[1:], launch, worker, usage, WORLD_SIZE)


if __name__ == "__main__":
    rpc_bench.run_main(main, "ps_sparse_bench")
