#!/usr/bin/python3
"""Benchmark W14 `failure_detection` on PyTorch RPC (see BENCHMARKS.md).

    failure_bench.py [--quick]

The peer of gradwire's bench/failure_bench.cc: five processes on 127.0.0.1 that this
script starts itself (`--rank 0..4`), torch.distributed.rpc with the TensorPipe backend
and its default RPC timeout (60 s), one compute thread each. worker0 drives; worker1 and
worker2 are parameter servers each holding half of a 1M-float table (SGD, lr 0.01, the
pushed gradient applied and the new half returned: one rpc_sync per server and step);
worker3 and worker4 are trainers pushing a gradient to both servers every step. Once both
trainers took 20 steps the driver freezes worker2 (SIGSTOP). frozen_reported_s: from the
freeze until the later trainer's pending call to worker2 raised (PyTorch has no failure
detector: that is its RPC timeout). A restarted worker2 cannot rejoin a running PyTorch
RPC group (the world is fixed at init_rpc), so there is no resumed_after_restart_s.

--quick changes nothing (the figure is the timeout); it is accepted for bench/run.
Result lines go to stdout from worker0 in the format
`workload=failure_detection impl=pytorch metric=... value=... unit=...`. The launcher
kills every process at the end (a group with a frozen member cannot shut down).
"""
import os
import signal
import subprocess
import sys
import threading
import time

WORLD = 5
FLOATS = 1 << 20
DEADLINE_S = 300

_events = {}
_lock = threading.Lock()


def _event(name):
    with _lock:
        return _events.setdefault(name, threading.Event())


_values = {}


def note(name, value):
    """Runs on the driver: a worker reports something."""
    _values[name] = value
    _event(name).set()
    return True


_table = None


def step(grad):
    """Runs on a server: apply SGD to this server's half, return it."""
    global _table
    import torch
    with _lock:
        if _table is None:
            _table = torch.zeros(FLOATS // 2)
        _table.add_(grad, alpha=-0.01)
        return _table.clone()


def worker(rank):
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions())
    if rank in (1, 2):
        rpc.rpc_sync("worker0", note, args=(f"pid{rank}", os.getpid()))
        time.sleep(DEADLINE_S)   # serves until killed
    elif rank in (3, 4):
        grad = torch.full((FLOATS // 2,), 0.001)
        steps = 0
        while True:
            try:
                rpc.rpc_sync("worker1", step, args=(grad,))
                rpc.rpc_sync("worker2", step, args=(grad,))
            except Exception as e:  # noqa: BLE001 (any failure is the measured event)
                rpc.rpc_sync("worker0", note, args=(f"reported{rank}", (time.time(), str(e)[:200])))
                time.sleep(DEADLINE_S)
            steps += 1
            if steps == 20:
                rpc.rpc_sync("worker0", note, args=(f"started{rank}", True))
    else:
        for name in ("pid1", "pid2", "started3", "started4"):
            if not _event(name).wait(120):
                raise RuntimeError(f"no {name} from the workers")
        frozen = time.time()
        os.kill(_values["pid2"], signal.SIGSTOP)
        latest = 0.0
        for name in ("reported3", "reported4"):
            if not _event(name).wait(DEADLINE_S - 60):
                raise RuntimeError(f"no {name}: a trainer's call to the frozen server never failed")
            t, why = _values[name]
            print(f"failure_detection: {name}: {why}", file=sys.stderr)
            latest = max(latest, t)
        print(f"workload=failure_detection impl=pytorch metric=frozen_reported_s value={latest - frozen:.6g} unit=s")
        print("failure_detection: PyTorch RPC cannot take a restarted worker2 back (fixed world): "
              "no resumed_after_restart_s", file=sys.stderr)
        sys.stdout.flush()
        os.kill(_values["pid2"], signal.SIGKILL)
        os._exit(0)   # the others are killed by the launcher


def main():
    args = sys.argv[1:]
    if args[:1] == ["--rank"]:
        worker(int(args[1]))
        return 0
    if any(a != "--quick" for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               TP_SOCKET_IFNAME="lo")
    print("failure_detection: PyTorch RPC, 2 servers + 2 trainers; freezing worker2 after 20 steps "
          "(its RPC timeout, 60 s, is the detector)", file=sys.stderr)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r)], env=env,
                              stdin=subprocess.DEVNULL) for r in range(WORLD)]
    try:
        code = procs[0].wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        code = 1
        print("failure_detection: timed out", file=sys.stderr)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
