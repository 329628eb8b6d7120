#!/usr/bin/python3
"""Benchmark W15 `scale_out` on PyTorch RPC (see BENCHMARKS.md).

    scale_bench.py [--quick]

The peer of gradwire's bench/scale_bench.cc: for N = 8, 16, 32, N processes on
127.0.0.1 that this script starts (`--rank r --world N`), torch.distributed.rpc with
the TensorPipe backend, one compute thread each. rendezvous_s_w<N>: from starting the
processes until worker0's init_rpc returned (it returns once every worker joined; the
time includes starting Python and importing torch, as gradwire's includes starting its
processes). Then every worker calls every other worker `calls` times (a no-op function,
rpc_async, one call to each peer in flight per round): calls_per_s_w<N> = N (N-1) calls /
the time from worker0's start of the calls to the last worker's end. shutdown_s_w<N>:
worker0's rpc.shutdown() (graceful: it waits for every worker). threads_w<N> / fds_w<N>:
the most any worker but worker0 had after its calls.

--quick: 10 calls to each peer instead of 100. Result lines go to stdout, in the format
`workload=scale_out impl=pytorch metric=... value=... unit=...`.
"""
import os
import subprocess
import sys
import threading
import time

DEADLINE_S = 600
_reports = {}
_cond = threading.Condition()


def noop():
    return 0


def report(rank, end, threads, fds):
    with _cond:
        _reports[rank] = (end, threads, fds)
        _cond.notify_all()
    return True


def call_all(rpc, world, rank, calls):
    for _ in range(calls):
        futs = [rpc.rpc_async(f"worker{p}", noop) for p in range(world) if p != rank]
        for f in futs:
            f.wait()


def worker(rank, world, calls, started):
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=120))
    met = time.time()
    go = time.time()
    call_all(rpc, world, rank, calls)
    end = time.time()
    if rank != 0:
        rpc.rpc_sync("worker0", report, args=(rank, end, len(os.listdir("/proc/self/task")),
                                              len(os.listdir("/proc/self/fd"))))
        rpc.shutdown()
        return
    with _cond:
        if not _cond.wait_for(lambda: len(_reports) == world - 1, timeout=DEADLINE_S / 2):
            raise RuntimeError("not every worker reported")
    last = max([end] + [r[0] for r in _reports.values()])
    stop = time.time()
    rpc.shutdown()
    shutdown = time.time() - stop
    w = f"_w{world}"
    lines = [("rendezvous_s" + w, met - started, "s"),
             ("calls_per_s" + w, world * (world - 1) * calls / (last - go), "calls/s"),
             ("shutdown_s" + w, shutdown, "s"),
             ("threads" + w, max(r[1] for r in _reports.values()), "threads"),
             ("fds" + w, max(r[2] for r in _reports.values()), "fds")]
    for metric, value, unit in lines:
        print(f"workload=scale_out impl=pytorch metric={metric} value={value:.6g} unit={unit}")
    sys.stdout.flush()


def main():
    args = sys.argv[1:]
    if args[:1] == ["--rank"]:
        worker(int(args[1]), int(args[3]), int(args[5]), float(args[7]))
        return 0
    if any(a != "--quick" for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    calls = 10 if args else 100
    import socket
    for world in (8, 16, 32):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   TP_SOCKET_IFNAME="lo")
        print(f"scale_out: PyTorch RPC, {world} workers, {calls} calls to each peer", file=sys.stderr)
        started = time.time()
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--world",
                                   str(world), "--calls", str(calls), "--started", repr(started)],
                                  env=env, stdin=subprocess.DEVNULL) for r in range(world)]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=DEADLINE_S))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        if any(codes):
            print(f"scale_out: worker exit codes {codes}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
