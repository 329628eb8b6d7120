#!/usr/bin/python3
"""Benchmark W4 `rref` on PyTorch RPC (see BENCHMARKS.md).

    rref_bench.py [--quick]

torch.distributed.rpc with the TensorPipe backend, set up exactly as rpc_bench.py
(its launcher helpers and TensorPipe probe are reused from there): two worker
processes on 127.0.0.1 that this script starts itself (`--rank 0|1`, a free
MASTER_PORT each run), one compute thread in each. Worker 0 calls, worker 1 owns.

- remote_1MiB_to_here: rpc.remote("worker1", make_tensor, (262144,)) creating a
  float32 tensor of 1 MiB on worker 1, then .to_here() on worker 0, timed together;
  20 warm-up + 200 timed; median and p90 (ms).
- rref churn: 5000 rpc.remote("worker1", <returns an int>) whose RRef is dropped at
  once (`del`); then worker 1's count of owner RRefs (RRef context debug info
  `num_owner_rrefs`, read with rpc_sync) is polled every 1 ms until it is back to
  its value before the churn (at most CHURN_DRAIN_S).
  rref_churn_rate = count / (first remote() .. count back) (RRefs/s);
  owner_rrefs_after_1s = live owner RRefs above that baseline 1 s after the loop
  ended (count); owner_rrefs_at_end_of_loop = the same right after the loop;
  owner_rrefs_drain_s = loop end .. count back (s).

--quick cuts the iteration counts about 10x (smoke test); metric names stay the same.
Result lines go to stdout from worker 0 only, in the format
`workload=rref impl=pytorch metric=... value=... unit=...`, after rpc.shutdown().
Every loop is bounded; a watchdog in each worker and a deadline in the launcher end
a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise; also
non-zero if the owner's count is not back to its baseline within CHURN_DRAIN_S.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from rpc_bench import line, percentile  # noqa: E402

WORKLOAD = "rref"
WORLD_SIZE = rpc_bench.WORLD_SIZE
RPC_TIMEOUT_S = rpc_bench.RPC_TIMEOUT_S
DEADLINE_S = {False: 300, True: 180}   # whole benchmark, by --quick
TENSOR_NUMEL = 262144                  # float32: 1 MiB
#             full (warm-up, timed, churn)   quick
ITERS = {False: (20, 200, 5000), True: (3, 20, 500)}
CHURN_DRAIN_S = 60           # most time to wait for the owner's count to come back
SETTLE_S = 10                # most time to wait for a stable baseline before the churn
POLL_S = 0.001


def usage(msg):
    print(f"rref_bench: {msg}\nusage: rref_bench.py [--quick]", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- remote functions
# Module-level so worker 1 resolves them by name (both workers run this file as __main__).

def make_tensor(numel):
    import torch
    return torch.ones(numel, dtype=torch.float32)


def small():
    return 7


def owner_rrefs():
    import torch.distributed.rpc as rpc
    return int(rpc._rref_context_get_debug_info()["num_owner_rrefs"])


# ---------------------------------------------------------------- worker side

def bench_remote_to_here(rpc, torch, quick):
    warmup, iters, _ = ITERS[quick]
    print(f"rref: remote_1MiB_to_here: {warmup} warm-up + {iters} timed remote()+to_here()",
          file=sys.stderr)
    want = torch.ones(TENSOR_NUMEL, dtype=torch.float32)
    for _ in range(warmup):
        r = rpc.remote("worker1", make_tensor, args=(TENSOR_NUMEL,))
        t = r.to_here()
        if t.dtype != torch.float32 or not torch.equal(t, want):
            raise RuntimeError("remote_1MiB_to_here: wrong tensor from worker1")
        del r, t
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        r = rpc.remote("worker1", make_tensor, args=(TENSOR_NUMEL,))
        t = r.to_here()
        ms.append((time.perf_counter() - t0) * 1e3)
        if t.numel() != TENSOR_NUMEL:
            raise RuntimeError("remote_1MiB_to_here: tensor has wrong size")
        del r, t
    ms.sort()
    print(f"rref: remote_1MiB_to_here: median {statistics.median(ms):.4g} ms", file=sys.stderr)
    return [line(WORKLOAD, "remote_1MiB_to_here_median", statistics.median(ms), "ms"),
            line(WORKLOAD, "remote_1MiB_to_here_p90", percentile(ms, 0.90), "ms")]


def settled_owner_count(rpc):
    """Worker 1's owner-RRef count once it stops falling (RRefs of earlier phases drain)."""
    deadline = time.monotonic() + SETTLE_S
    last, since = rpc.rpc_sync("worker1", owner_rrefs), time.monotonic()
    while last != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
        n = rpc.rpc_sync("worker1", owner_rrefs)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since > 1.0:
            break
    return last


def bench_churn(rpc, quick):
    count = ITERS[quick][2]
    base = settled_owner_count(rpc)
    print(f"rref: churn: {count} remote() RRefs created and dropped; owner count before: {base}",
          file=sys.stderr)
    t0 = time.perf_counter()
    for _ in range(count):
        r = rpc.remote("worker1", small)
        del r
    t_loop = time.perf_counter()
    at_end = rpc.rpc_sync("worker1", owner_rrefs) - base
    t_1s = t_loop + 1.0
    after_1s = None
    t_back = None
    peak = at_end
    n = at_end
    while True:
        now = time.perf_counter()
        if after_1s is None and now >= t_1s:
            after_1s = n
        if n <= 0:
            t_back = t_back or now
            if after_1s is not None:
                break
            time.sleep(max(0.0, t_1s - time.perf_counter()))
        elif now - t_loop > CHURN_DRAIN_S:
            break
        else:
            time.sleep(POLL_S)
        n = rpc.rpc_sync("worker1", owner_rrefs) - base
        peak = max(peak, n)
    print(f"rref: churn: loop {t_loop - t0:.3f} s; owner count above baseline: at loop end "
          f"{at_end}, peak {peak}, 1 s after {after_1s}; "
          + (f"back to baseline {t_back - t_loop:.3f} s after the loop" if t_back is not None
             else f"still {n} after {CHURN_DRAIN_S} s"), file=sys.stderr)
    if t_back is None:
        raise RuntimeError(f"rref churn: worker1 still owns {n} RRefs above its baseline "
                           f"{CHURN_DRAIN_S} s after the loop")
    return [line(WORKLOAD, "rref_churn_rate", count / (t_back - t0), "RRefs/s"),
            line(WORKLOAD, "owner_rrefs_after_1s", after_1s, "count"),
            line(WORKLOAD, "owner_rrefs_at_end_of_loop", at_end, "count"),
            line(WORKLOAD, "owner_rrefs_drain_s", t_back - t_loop, "s")]


def worker(rank, quick):
    rpc_bench.run_worker(rank, DEADLINE_S[quick], lambda torch, rpc: (
        bench_remote_to_here(rpc, torch, quick) + bench_churn(rpc, quick)))


# ---------------------------------------------------------------- launcher side

def launch(quick):
    q = ["--quick"] if quick else []
    return rpc_bench.launch_pair(__file__, " ".join(["rref_bench"] + q), q, DEADLINE_S[quick])


def main():
    return rpc_bench.quick_main(sys.argv[1:], launch, worker, usage)


if __name__ == "__main__":
    rpc_bench.run_main(main, "rref_bench")
