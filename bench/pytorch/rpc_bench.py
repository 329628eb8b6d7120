#!/usr/bin/python3
"""Benchmark W1 `rpc_latency`, W2 `tensor_echo`, W3 `async_pipelined` on PyTorch RPC
(see BENCHMARKS.md).

    rpc_bench.py [--quick] WORKLOAD        WORKLOAD: rpc_latency | tensor_echo | async_pipelined

torch.distributed.rpc with the TensorPipe backend (default transports and channels,
only the timeouts set), two worker processes on 127.0.0.1 that this script starts
itself (`--rank 0|1`, a free MASTER_PORT each run), one compute thread in each
(`torch.set_num_threads(1)`, OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1). Worker 0 calls,
worker 1 serves.

- rpc_latency: rpc_sync of a function taking no tensor, returning an int;
  100 warm-up + 2000 timed calls; median and p99 round trip (us).
- tensor_echo: rpc_sync echo of a float32 tensor of 4 KiB, 1 MiB, 16 MiB, 64 MiB;
  median round trip (ms) and GB/s counting bytes both ways (2*size/median/1e9).
- async_pipelined: 20000 rpc_async no-op calls, at most 64 outstanding; calls/s.

--quick cuts the iteration counts about 10x (smoke test); metric names stay the same.
Before the run a short probe pair of workers with TensorPipe's verbose log on finds
which transport and channel the two workers negotiate; a one-line header with it goes
to stderr. Result lines go to stdout from worker 0 only, in the format
`workload=<name> impl=pytorch metric=... value=... unit=...`, after rpc.shutdown().
Every loop is bounded; a watchdog in each worker and a deadline in the launcher end
a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import collections
import faulthandler
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKLOADS = ("rpc_latency", "tensor_echo", "async_pipelined")
WORLD_SIZE = 2
RPC_TIMEOUT_S = 120          # per call, and the rendezvous store
DEADLINE_S = {False: 600, True: 180}   # whole benchmark, by --quick
PROBE_DEADLINE_S = 90
WINDOW = 64                  # async_pipelined: most calls outstanding
SIZES = (("4KiB", 4 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20), ("64MiB", 64 << 20))
#                     full (warm-up, timed)   quick (warm-up, timed)
ECHO_ITERS = {"4KiB": ((20, 200), (5, 20)), "1MiB": ((10, 100), (3, 10)),
              "16MiB": ((3, 20), (1, 3)), "64MiB": ((2, 10), (1, 3))}


def usage(msg):
    print(f"rpc_bench: {msg}\nusage: rpc_bench.py [--quick] {{{'|'.join(WORKLOADS)}}}",
          file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- remote functions
# Module-level so worker 1 resolves them by name (both workers run this file as __main__).

def answer():
    return 42


def echo(t):
    return t


def noop():
    return None


# ---------------------------------------------------------------- worker side

def line(workload, metric, value, unit):
    return f"workload={workload} impl=pytorch metric={metric} value={value:.6g} unit={unit}"


def percentile(sorted_xs, p):
    """Nearest-rank percentile of an already sorted list."""
    return sorted_xs[max(0, math.ceil(p * len(sorted_xs)) - 1)]


def bench_rpc_latency(rpc, quick):
    warmup, iters = (10, 200) if quick else (100, 2000)
    print(f"rpc_latency: {warmup} warm-up + {iters} timed rpc_sync calls", file=sys.stderr)
    for _ in range(warmup):
        if rpc.rpc_sync("worker1", answer) != 42:
            raise RuntimeError("rpc_latency: wrong answer from worker1")
    us = []
    for _ in range(iters):
        t0 = time.perf_counter()
        r = rpc.rpc_sync("worker1", answer)
        us.append((time.perf_counter() - t0) * 1e6)
        if r != 42:
            raise RuntimeError("rpc_latency: wrong answer from worker1")
    us.sort()
    return [line("rpc_latency", "rtt_median", statistics.median(us), "us"),
            line("rpc_latency", "rtt_p99", percentile(us, 0.99), "us")]


def bench_tensor_echo(rpc, torch, quick):
    out = []
    for name, nbytes in SIZES:
        warmup, iters = ECHO_ITERS[name][1 if quick else 0]
        t = torch.rand(nbytes // 4, dtype=torch.float32)
        print(f"tensor_echo: {name}: {warmup} warm-up + {iters} timed echoes", file=sys.stderr)
        for _ in range(warmup):
            r = rpc.rpc_sync("worker1", echo, args=(t,))
            if r.dtype != torch.float32 or r.numel() != t.numel() or not torch.equal(r, t):
                raise RuntimeError(f"tensor_echo: {name}: echoed tensor differs")
            del r
        ms = []
        for _ in range(iters):
            t0 = time.perf_counter()
            r = rpc.rpc_sync("worker1", echo, args=(t,))
            ms.append((time.perf_counter() - t0) * 1e3)
            if r.numel() != t.numel():
                raise RuntimeError(f"tensor_echo: {name}: echoed tensor has wrong size")
            del r
        med = statistics.median(ms)
        out.append(line("tensor_echo", f"echo_{name}_rtt_median", med, "ms"))
        out.append(line("tensor_echo", f"echo_{name}_bw", 2 * nbytes / (med / 1e3) / 1e9, "GB/s"))
        print(f"tensor_echo: {name}: median {med:.4g} ms", file=sys.stderr)
    return out


def bench_async_pipelined(rpc, quick):
    n = 2000 if quick else 20000
    warmup = 200 if quick else 1000
    print(f"async_pipelined: {warmup} warm-up + {n} timed rpc_async calls, "
          f"at most {WINDOW} outstanding", file=sys.stderr)

    def run(count):
        window = collections.deque()
        for _ in range(count):
            if len(window) >= WINDOW:
                window.popleft().wait()
            window.append(rpc.rpc_async("worker1", noop))
        while window:
            window.popleft().wait()

    run(warmup)
    t0 = time.perf_counter()
    run(n)
    elapsed = time.perf_counter() - t0
    return [line("async_pipelined", "calls_per_s", n / elapsed, "calls/s")]


def run_worker(rank, deadline_s, bench, world_size=WORLD_SIZE):
    """One worker of world_size: a watchdog (dumps the stacks and exits 10 s before
    deadline_s, the launcher's deadline), one compute thread, init_rpc as worker<rank>;
    on rank 0, bench(torch, rpc) returns the result lines, printed after rpc.shutdown()."""
    faulthandler.dump_traceback_later(deadline_s - 10, exit=True)
    import torch
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(rpc_timeout=RPC_TIMEOUT_S)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    lines = bench(torch, rpc) if rank == 0 else []
    rpc.shutdown()   # graceful: the other workers wait here until worker 0 is done
    for ln in lines:
        print(ln)
    sys.stdout.flush()
    faulthandler.cancel_dump_traceback_later()


def probe_calls(rpc, torch):
    """One small call and one tensor each way: enough to open pipes and channels."""
    if rpc.rpc_sync("worker1", answer) != 42:
        raise RuntimeError("probe: wrong answer")
    t = torch.ones(1 << 18)
    if not torch.equal(rpc.rpc_sync("worker1", echo, args=(t,)), t):
        raise RuntimeError("probe: echoed tensor differs")
    return []


def worker(rank, workload, quick, probe):
    def bench(torch, rpc):
        torch.manual_seed(0)
        if probe:
            return probe_calls(rpc, torch)
        if workload == "rpc_latency":
            return bench_rpc_latency(rpc, quick)
        if workload == "tensor_echo":
            return bench_tensor_echo(rpc, torch, quick)
        return bench_async_pipelined(rpc, quick)

    run_worker(rank, PROBE_DEADLINE_S if probe else DEADLINE_S[quick], bench)


# ---------------------------------------------------------------- launcher side

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.setdefault("TP_SOCKET_IFNAME", "lo")   # TensorPipe's TCP (uv) listener on loopback
    env.pop("TP_VERBOSE_LOGGING", None)
    env.update(extra or {})
    return env


def start_pair(args, env, stderr_files=None, script=__file__, world_size=WORLD_SIZE):
    """All world_size workers: `script --rank <r> args...` (stdout and stderr inherited
    unless stderr_files, one a rank, then stdout is dropped)."""
    procs = []
    for rank in range(world_size):
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(script), "--rank", str(rank)] + args,
            env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if stderr_files else None,
            stderr=stderr_files[rank] if stderr_files else None))
    return procs


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def wait_pair(procs, timeout_s):
    """Wait for all workers; None if all exit 0, else why not (all are then gone)."""
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return None
        now = time.monotonic()
        if any(c not in (None, 0) for c in codes):
            # One worker failed: the others (likely blocked in rpc.shutdown) get a
            # moment to report, then are stopped.
            failed_at = failed_at or now
            if all(c is not None for c in codes) or now - failed_at > 5:
                kill_all(procs)
                return f"worker exit codes {[p.returncode for p in procs]}"
        if now > deadline:
            kill_all(procs)
            return f"timed out after {timeout_s} s"
        time.sleep(0.1)


def probe_tensorpipe():
    """Run a short worker pair with TensorPipe's verbose log; say what it negotiated."""
    files = [tempfile.TemporaryFile() for _ in range(WORLD_SIZE)]
    try:
        procs = start_pair(["--probe"], child_env({"TP_VERBOSE_LOGGING": "3"}), files)
        why = wait_pair(procs, PROBE_DEADLINE_S)
        logs = []
        for f in files:
            f.seek(0)
            logs.append(f.read().decode(errors="replace"))
    finally:
        for f in files:
            f.close()
    if why:
        tail = [ln for log in logs for ln in log.splitlines()
                if ln.strip() and not ln.startswith(("V", "I", "W", "WARNING"))][-2:]
        return f"unknown (probe failed: {why}: {' | '.join(tail)})"
    # Stop each worker's log where its context starts closing: listeners then report
    # their aborted pending accepts as done too.
    text = "\n".join(re.split(r"Context worker\d is closing", log)[0] for log in logs)
    reg_t = list(dict.fromkeys(re.findall(r"Context worker0 is registering transport (\w+)", text)))
    reg_c = list(dict.fromkeys(re.findall(r"Context worker0 is registering channel (\w+)", text)))
    used_t, seen = [], set()
    # The first connection a listener accepts is the bootstrap one (from the
    # worker's URL); the rest are the negotiated replacement and channel connections.
    for listener, tr in re.findall(r"Listener (\S+) done accepting connection on transport (\w+)", text):
        if listener in seen:
            used_t.append(tr)
        seen.add(listener)
    used_c = re.findall(r"\(for channel (\w+)\)", text)
    used_t = ",".join(dict.fromkeys(used_t)) or "?"
    used_c = ",".join(dict.fromkeys(used_c)) or "?"
    return (f"transports registered [{','.join(reg_t) or '?'}] channels registered "
            f"[{','.join(reg_c) or '?'}]; negotiated between the workers: transport {used_t}, "
            f"CPU tensor channel {used_c}")


def launch_pair(script, title, args, deadline_s, world_size=WORLD_SIZE):
    """Probes TensorPipe (with a pair of workers), prints a header `<title>: torch ...,
    <what it negotiated>` on stderr, runs the world_size workers of `script` with args
    and waits at most deadline_s. Exit status: 0 if all workers exit 0, else 1 (why on
    stderr)."""
    import torch
    tp = probe_tensorpipe()
    print(f"{title}: torch {torch.__version__}, TensorPipe backend (rpc_timeout "
          f"{RPC_TIMEOUT_S}s, default worker threads); {tp}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    why = wait_pair(start_pair(args, child_env(), script=script, world_size=world_size),
                    deadline_s)
    if why:
        print(f"{title}: failed: {why}", file=sys.stderr)
        return 1
    return 0


def quick_main(argv, launch, worker, usage, world_size=WORLD_SIZE):
    """main() of a one-workload script: `[--quick]` runs launch(quick), `--rank <r>
    [--quick]` with r < world_size (as the launcher starts it) runs worker(r, quick);
    else usage()."""
    quick = "--quick" in argv
    rest = [a for a in argv if a != "--quick"]
    if not rest:
        return launch(quick)
    if len(rest) == 2 and rest[0] == "--rank" and rest[1] in map(str, range(world_size)):
        worker(int(rest[1]), quick)
        return 0
    usage(f"unexpected arguments: {' '.join(rest)}")
    return 2


def run_main(main, prog):
    """sys.exit(main()); any exception is printed with its traceback and exits 1."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:   # noqa: BLE001 - report any failure, exit non-zero
        import traceback
        traceback.print_exc()
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(1)


def launch(workload, quick):
    q = ["--quick"] if quick else []
    return launch_pair(__file__, " ".join(["rpc_bench", workload] + q), [workload] + q,
                       DEADLINE_S[quick])


def main():
    argv = sys.argv[1:]
    quick = "--quick" in argv
    probe = "--probe" in argv
    rank = None
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--rank":
            if i + 1 >= len(argv) or argv[i + 1] not in ("0", "1"):
                usage("--rank needs 0 or 1")
            rank = int(argv[i + 1])
            i += 2
            continue
        if a not in ("--quick", "--probe"):
            rest.append(a)
        i += 1
    if probe and rank is not None:
        worker(rank, None, quick, probe=True)
        return 0
    if len(rest) != 1 or rest[0] not in WORKLOADS:
        usage("need exactly one workload")
    if rank is not None:
        worker(rank, rest[0], quick, probe=False)
        return 0
    return launch(rest[0], quick)


if __name__ == "__main__":
    run_main(main, "rpc_bench")
