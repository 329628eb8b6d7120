#!/usr/bin/python3
"""Benchmark W13 `serve_mlp` on PyTorch RPC (see BENCHMARKS.md).

    serve_bench.py [--quick] [closed|open|all]        (default all)

torch.distributed.rpc with the TensorPipe backend, set up exactly as rpc_bench.py
(its launcher helpers and TensorPipe probe are reused from there), three worker
processes on 127.0.0.1 that this script starts itself (`--rank 0|1|2`, a free
MASTER_PORT each run), one compute thread in each (torch.set_num_threads(1),
OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1); the launcher is the fourth process and
only waits. Worker 0 is the server and the coordinator; workers 1 and 2 are the two
client processes.

The model: an MLP Linear 784-256-128-10 with ReLUs (Linear+ReLU+Linear+ReLU+Linear),
float32, torch's default init from torch.manual_seed(0), eval mode, run under
torch.no_grad() on worker 0. A request is one sample, a [1,784] float32 tensor; the
reply its 10 logits, [1,10]. Two peers, each a module-level function on worker 0
that the clients call (rpc_sync in the closed loop, rpc_async in the open loop):

- plain: `infer(x)` runs the model on the sample (no batching).
- batching: `infer_batched(x)` is @rpc.functions.async_execution: it queues the
  sample with a fresh torch.futures.Future and returns that future; one batching
  thread flushes the queue at BATCH_MAX (32) requests or BATCH_WAIT_S (2 ms) after
  the oldest queued request arrived, whichever comes first, torch.cat's the samples,
  runs the model once, splits the output into rows and completes each future with
  its row (which sends that reply).

Before measuring, each client process checks both peers' replies for 8 samples (the
batching peer's sent concurrently, so they share batches) against the same model run
locally; the run fails if a logit differs by more than CHECK_ATOL.

Closed loop (phase `closed`): C = 1, 16, 64 clients, split over the two client
processes as 1+0, 8+8, 32+32. Each client has exactly one request outstanding and
sends the next one when the reply arrives: each client is a Python thread looping
over rpc_sync. Of the two ways tried on this 2-core VM (5 interleaved rounds of each
configuration), it gave the batching peer 12-17% more requests/s at C=16 and 64
than the other way, rpc_async with a done-callback (Future.add_done_callback) that
sends the client's next request from the RPC thread completing the future, and the
plain peer about the same (within the machine's noise) at every C. 1 s warm-up,
then 5 s measured (--quick: 0.3 s, 1 s). Both client processes run the
same window of the shared monotonic clock (CLOCK_MONOTONIC, one host): the
coordinator first waits for both to be ready (an rpc_sync barrier: the correctness
check), then sends both the same start instant START_LEAD_S ahead, so the measured
windows coincide. Latency is from just before rpc_sync to its return;
requests/s = requests completed in the measured window (both processes) / window;
p50 and p99 (nearest rank) over those requests' latencies, both processes' merged.
Metrics rps_c<C> (req/s), p50_ms_c<C>, p99_ms_c<C> (ms); batching_* for the
batching peer.

Open loop (phase `open`), the batching peer first, then plain: at rising rates
OPEN_RATES (250, 500, 1000, 2000, 3000, 4000, 6000 req/s in total; --quick: 500,
2000) each client process sends at half the rate, Poisson arrivals (exponential
gaps from a seeded generator), with rpc_async from one sender thread that sleeps
until each scheduled time (sending at once when behind schedule); the reply's time
is taken in the future's done-callback. At most OPEN_CAP (4096) requests are
outstanding a client process; the sender waits for replies beyond that. 0.5 s
warm-up, 2 s measured (--quick: 0.2 s, 0.5 s). Latency counts from the *scheduled*
send time, so a client's own backlog counts as queueing delay; p50 and p99 are over
the requests scheduled in the measured window (their replies are awaited up to
DRAIN_S after it; one still missing then counts with its latency so far, a lower
bound); achieved requests/s = replies completed in the measured window / window.
Once a rate's p99 exceeds OPEN_P99_STOP_MS (1 s), that peer's higher rates are not
run. Metrics batching_open_rps_r<rate> (req/s), batching_open_p50_ms_r<rate>,
batching_open_p99_ms_r<rate> (ms); open_* for the plain peer.

--quick shortens every window (smoke test); metric names stay the same.
Progress, one line a configuration, goes to stderr. Result lines go to stdout from
worker 0 only, in the format `workload=serve_mlp impl=pytorch metric=... value=...
unit=...`, after rpc.shutdown(). Every loop is bounded; a watchdog in each worker
and a deadline in the launcher end a hung run. Exit status 0 on success, non-zero
(error on stderr) otherwise.
"""
import collections
import os
import random
import sys
import threading
import time

import torch
import torch.distributed.rpc as rpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from local_mlp import blas_core  # noqa: E402  (runs nothing on import)
from rpc_bench import line, percentile  # noqa: E402

WORKLOAD = "serve_mlp"
WORLD_SIZE = 3               # worker0: server and coordinator, worker1, worker2: clients
SERVER = "worker0"
CLIENTS = ("worker1", "worker2")
PHASES = ("closed", "open", "all")
DEADLINE_S = {False: 360, True: 150}   # whole benchmark (after the probe), by --quick
SIZES = (784, 256, 128, 10)
BATCH_MAX = 32               # batching peer: flush at this many requests ...
BATCH_WAIT_S = 0.002         # ... or this long after the oldest queued one arrived
CHECK_SAMPLES = 8
CHECK_ATOL = 1e-5            # served vs local logits
CONCURRENCY = {1: (1, 0), 16: (8, 8), 64: (32, 32)}   # C -> clients in each process
CLOSED_WINDOW_S = {False: (1.0, 5.0), True: (0.3, 1.0)}   # (warm-up, measured)
OPEN_RATES = {False: (250, 500, 1000, 2000, 3000, 4000, 6000), True: (500, 2000)}   # req/s, total
OPEN_WINDOW_S = {False: (0.5, 2.0), True: (0.2, 0.5)}     # (warm-up, measured)
OPEN_P99_STOP_MS = 1000.0    # no higher rates for a peer once its p99 exceeds this
OPEN_CAP = 4096              # most requests outstanding a client process (open loop)
DRAIN_S = {False: 10.0, True: 5.0}   # replies of measured requests awaited this long
IDLE_S = 30.0                # then every outstanding reply, at most this long
START_LEAD_S = 0.3           # start instant this far after the coordinator sends it
PEERS = ("plain", "batching")
PREFIX = {"plain": "", "batching": "batching_"}


def usage(msg):
    print(f"serve_bench: {msg}\nusage: serve_bench.py [--quick] [{'|'.join(PHASES)}]",
          file=sys.stderr)
    sys.exit(2)


def note(msg):
    print(f"{WORKLOAD}: {msg}", file=sys.stderr, flush=True)


def mlp():
    torch.manual_seed(0)
    layers = []
    for i in range(len(SIZES) - 1):
        layers += [torch.nn.Linear(SIZES[i], SIZES[i + 1]), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).eval()


# ---------------------------------------------------------------- server (worker 0)
# Module-level so the clients name them (every worker runs this file as __main__);
# _MODEL and _BATCHER exist on worker 0 only.

_MODEL = None
_BATCHER = None


def infer(x):
    with torch.no_grad():
        return _MODEL(x)


@rpc.functions.async_execution
def infer_batched(x):
    return _BATCHER.submit(x)


class Batcher:
    """A queue of (arrival, sample, future) flushed by one thread at BATCH_MAX requests
    or BATCH_WAIT_S after the oldest queued request arrived."""

    def __init__(self, model):
        self.model = model
        self.cond = threading.Condition()
        self.queue = collections.deque()
        self.stopping = False
        self.batches = 0
        self.requests = 0
        self.thread = threading.Thread(target=self.loop, name="batcher", daemon=True)
        self.thread.start()

    def submit(self, x):
        fut = torch.futures.Future()
        with self.cond:
            self.queue.append((time.monotonic(), x, fut))
            if len(self.queue) in (1, BATCH_MAX):   # the batcher waits for one of these
                self.cond.notify()
        return fut

    def take(self):
        """The next batch (a list of queue entries), or None once stopping."""
        with self.cond:
            while not self.queue:
                if self.stopping:
                    return None
                self.cond.wait(0.5)
            flush_at = self.queue[0][0] + BATCH_WAIT_S
            while len(self.queue) < BATCH_MAX:
                left = flush_at - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return [self.queue.popleft() for _ in range(min(BATCH_MAX, len(self.queue)))]

    def loop(self):
        while True:
            batch = self.take()
            if batch is None:
                return
            try:
                with torch.no_grad():
                    out = self.model(torch.cat([x for _, x, _ in batch]))
                rows = [r.clone() for r in out.split(1)]   # each reply its own [1,10]
            except Exception as e:   # noqa: BLE001 - the callers get the error
                for _, _, fut in batch:
                    fut.set_exception(e)
                continue
            self.batches += 1
            self.requests += len(batch)
            for (_, _, fut), row in zip(batch, rows):
                fut.set_result(row)   # runs the RPC's reply send, in this thread

    def stop(self):
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=10)


PEER_FN = {"plain": infer, "batching": infer_batched}


# ---------------------------------------------------------------- clients (workers 1, 2)

_SAMPLE = None   # this client process's request


def client_prepare(proc):
    """Checks both peers' replies for CHECK_SAMPLES samples against the model run
    here; keeps one sample as this process's request. The largest difference."""
    global _SAMPLE
    gen = torch.Generator().manual_seed(100 + proc)
    xs = [torch.randn(1, SIZES[0], generator=gen) for _ in range(CHECK_SAMPLES)]
    with torch.no_grad():
        model = mlp()
        want = [model(x) for x in xs]
    got = [rpc.rpc_sync(SERVER, infer, args=(x,)) for x in xs]
    futs = [rpc.rpc_async(SERVER, infer_batched, args=(x,)) for x in xs]
    got += [f.wait() for f in futs]
    worst = 0.0
    for g, w in zip(got, want + want):
        if g.shape != (1, SIZES[-1]) or g.dtype != torch.float32:
            raise RuntimeError(f"reply of shape {tuple(g.shape)} {g.dtype}, expected "
                               f"(1, {SIZES[-1]}) float32")
        worst = max(worst, (g - w).abs().max().item())
    if not worst <= CHECK_ATOL:
        raise RuntimeError(f"served logits differ from the local model's by {worst:.3g} "
                           f"(more than {CHECK_ATOL:g})")
    _SAMPLE = xs[0]
    return worst


def sleep_until(t):
    left = t - time.monotonic()
    if left > 0:
        time.sleep(left)


def client_closed(peer, n, t_start, warmup_s, measured_s):
    """n closed-loop clients, each a thread looping over rpc_sync, from t_start (shared
    monotonic clock) to the end of the window; (latencies in ms of the requests
    completed in the measured window, float64; how late this process got the start,
    s)."""
    fn = PEER_FN[peer]
    late = time.monotonic() - t_start if n else 0.0
    t_meas, t_end = t_start + warmup_s, t_start + warmup_s + measured_s
    lat_ms = [[] for _ in range(n)]
    errors = []

    def client(mine):
        try:
            sleep_until(t_start)
            t1 = t_start
            while t1 < t_end and not errors:
                t0 = time.monotonic()
                out = rpc.rpc_sync(SERVER, fn, args=(_SAMPLE,))
                t1 = time.monotonic()
                if out.shape != (1, SIZES[-1]):
                    raise RuntimeError(f"reply of shape {tuple(out.shape)}")
                if t_meas <= t1 <= t_end:
                    mine.append((t1 - t0) * 1e3)
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=client, args=(mine,), name=f"client{i}", daemon=True)
               for i, mine in enumerate(lat_ms)]
    for t in threads:
        t.start()
    give_up = t_end + IDLE_S   # every rpc_sync is bounded by the RPC timeout too
    for t in threads:
        t.join(timeout=max(0.0, give_up - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"closed loop: clients still waiting for a reply {IDLE_S} s "
                           f"after the window")
    if errors:
        raise RuntimeError(f"closed loop: a request failed: {errors[0]}")
    return torch.tensor([x for mine in lat_ms for x in mine], dtype=torch.float64), late


def client_open(peer, rate, seed, t_start, warmup_s, measured_s, drain_s):
    """Poisson arrivals at `rate` req/s from t_start to the end of the window, at most
    OPEN_CAP outstanding. (replies completed in the measured window; latencies in ms
    from the scheduled time of the requests scheduled in the window, float64; how
    many of those were still unanswered drain_s after the window; the sender's
    largest lag behind schedule, ms; how late this process got the start, s)."""
    fn = PEER_FN[peer]
    rng = random.Random(seed)
    t_meas, t_end = t_start + warmup_s, t_start + warmup_s + measured_s
    cond = threading.Condition()
    state = {"outstanding": 0, "error": None}
    sched = []            # scheduled send time of request k
    done = {}             # k -> reply time

    def on_reply(fut, k):
        t1 = time.monotonic()
        try:
            if fut.value().shape != (1, SIZES[-1]):
                raise RuntimeError("reply of the wrong shape")
        except Exception as e:   # noqa: BLE001 - reported below
            state["error"] = state["error"] or e
        done[k] = t1
        with cond:
            state["outstanding"] -= 1
            if state["outstanding"] in (0, OPEN_CAP - 1):
                cond.notify_all()

    late = time.monotonic() - t_start
    give_up = t_end + drain_s + IDLE_S   # bounds every wait below
    max_lag = 0.0
    t_next = t_start + rng.expovariate(rate)
    sleep_until(t_start)
    while t_next < t_end and state["error"] is None:
        sleep_until(t_next)
        with cond:
            while state["outstanding"] >= OPEN_CAP:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"open loop: {OPEN_CAP} replies outstanding "
                                       f"for too long")
                cond.wait(0.1)
            state["outstanding"] += 1
        k = len(sched)
        sched.append(t_next)
        max_lag = max(max_lag, time.monotonic() - t_next)
        rpc.rpc_async(SERVER, fn, args=(_SAMPLE,)).add_done_callback(
            lambda f, k=k: on_reply(f, k))
        t_next += rng.expovariate(rate)
    cut = t_end + drain_s
    with cond:
        while state["outstanding"] and time.monotonic() < cut:
            cond.wait(0.05)
    t_cut = time.monotonic()
    done_at_cut = dict(done)
    lat_ms, missing = [], 0
    for k, s in enumerate(sched):
        if s >= t_meas:
            d = done_at_cut.get(k)
            if d is None:
                missing += 1
                d = t_cut   # still unanswered: a lower bound
            lat_ms.append((d - s) * 1e3)
    completed = sum(1 for d in done_at_cut.values() if t_meas <= d <= t_end)
    with cond:   # the next configuration starts with nothing outstanding
        while state["outstanding"]:
            if time.monotonic() > give_up:
                raise RuntimeError(f"open loop: {state['outstanding']} replies still "
                                   f"outstanding {IDLE_S} s after the drain")
            cond.wait(0.05)
    if state["error"] is not None:
        raise RuntimeError(f"open loop: a request failed: {state['error']}")
    return (completed, torch.tensor(lat_ms, dtype=torch.float64), missing, max_lag * 1e3,
            late)


# ---------------------------------------------------------------- coordinator (worker 0)

def merged(lats):
    xs = torch.cat(lats).sort().values.tolist()
    if not xs:
        raise RuntimeError("no request completed in the measured window")
    return xs


def check_start(results, idx):
    late = max(r[idx] for r in results)
    if late > 0:
        note(f"warning: a client process got the start instant {late * 1e3:.1f} ms late "
             f"(START_LEAD_S {START_LEAD_S})")


def batcher_counts():
    return _BATCHER.batches, _BATCHER.requests


def batch_note(peer, before):
    if peer != "batching":
        return ""
    b, r = (x - y for x, y in zip(batcher_counts(), before))
    return f"; mean batch {r / max(b, 1):.1f}"


def closed_config(peer, c, quick):
    warmup_s, measured_s = CLOSED_WINDOW_S[quick]
    before = batcher_counts()
    t_start = time.monotonic() + START_LEAD_S
    futs = [rpc.rpc_async(w, client_closed, args=(peer, n, t_start, warmup_s, measured_s))
            for w, n in zip(CLIENTS, CONCURRENCY[c])]
    results = [f.wait() for f in futs]
    check_start(results, 1)
    lat = merged([r[0] for r in results])
    rps, p50, p99 = len(lat) / measured_s, percentile(lat, 0.5), percentile(lat, 0.99)
    note(f"closed {peer} C={c} ({'+'.join(map(str, CONCURRENCY[c]))}): {rps:.0f} req/s, "
         f"p50 {p50:.3f} ms, p99 {p99:.3f} ms ({len(lat)} requests in {measured_s:g} s"
         f"{batch_note(peer, before)})")
    return rps, p50, p99


def open_config(peer, rate, quick):
    warmup_s, measured_s = OPEN_WINDOW_S[quick]
    before = batcher_counts()
    t_start = time.monotonic() + START_LEAD_S
    futs = [rpc.rpc_async(w, client_open,
                          args=(peer, rate / len(CLIENTS), 1000 * rate + i, t_start,
                                warmup_s, measured_s, DRAIN_S[quick]))
            for i, w in enumerate(CLIENTS)]
    results = [f.wait() for f in futs]
    check_start(results, 4)
    lat = merged([r[1] for r in results])
    rps = sum(r[0] for r in results) / measured_s
    p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
    missing = sum(r[2] for r in results)
    lag = max(r[3] for r in results)
    note(f"open {peer} rate {rate}/s: {rps:.0f} req/s done, p50 {p50:.3f} ms, p99 "
         f"{p99:.3f} ms ({len(lat)} requests scheduled in {measured_s:g} s; sender lag "
         f"at most {lag:.1f} ms" + (f"; {missing} unanswered {DRAIN_S[quick]:g} s after "
                                    f"the window, counted as lower bounds" if missing else "")
         + f"{batch_note(peer, before)})")
    return rps, p50, p99


def run(quick, phase):
    global _MODEL, _BATCHER
    _MODEL = mlp()
    _BATCHER = Batcher(_MODEL)
    note(f"MLP {'-'.join(map(str, SIZES))} (eval, no_grad) on worker 0, BLAS core "
         f"{blas_core()}, {torch.get_num_threads()} thread; batching peer flushes at "
         f"{BATCH_MAX} requests or {BATCH_WAIT_S * 1e3:g} ms")
    futs = [rpc.rpc_async(w, client_prepare, args=(i,)) for i, w in enumerate(CLIENTS)]
    worst = max(f.wait() for f in futs)
    note(f"both client processes ready; served vs local logits (both peers): largest "
         f"difference {worst:.3g}")
    lines = []
    if phase in ("closed", "all"):
        warmup_s, measured_s = CLOSED_WINDOW_S[quick]
        note(f"closed loop: C = {', '.join(map(str, CONCURRENCY))}; {warmup_s:g} s warm-up "
             f"+ {measured_s:g} s measured each")
        for peer in PEERS:
            for c in CONCURRENCY:
                rps, p50, p99 = closed_config(peer, c, quick)
                pre = PREFIX[peer]
                lines += [line(WORKLOAD, f"{pre}rps_c{c}", rps, "req/s"),
                          line(WORKLOAD, f"{pre}p50_ms_c{c}", p50, "ms"),
                          line(WORKLOAD, f"{pre}p99_ms_c{c}", p99, "ms")]
    if phase in ("open", "all"):
        warmup_s, measured_s = OPEN_WINDOW_S[quick]
        note(f"open loop: Poisson arrivals at {', '.join(map(str, OPEN_RATES[quick]))} "
             f"req/s (total); {warmup_s:g} s warm-up + {measured_s:g} s measured each; at "
             f"most {OPEN_CAP} outstanding a client process")
        for peer in reversed(PEERS):   # batching first
            for rate in OPEN_RATES[quick]:
                rps, p50, p99 = open_config(peer, rate, quick)
                pre = PREFIX[peer] + "open_"
                lines += [line(WORKLOAD, f"{pre}rps_r{rate}", rps, "req/s"),
                          line(WORKLOAD, f"{pre}p50_ms_r{rate}", p50, "ms"),
                          line(WORKLOAD, f"{pre}p99_ms_r{rate}", p99, "ms")]
                if p99 > OPEN_P99_STOP_MS:
                    note(f"open {peer}: p99 above {OPEN_P99_STOP_MS:g} ms at {rate}/s; "
                         f"no higher rates")
                    break
    _BATCHER.stop()
    return lines


def worker(rank, quick, phase):
    rpc_bench.run_worker(rank, DEADLINE_S[quick],
                         lambda torch_, rpc_: run(quick, phase), WORLD_SIZE)


# ---------------------------------------------------------------- launcher side

def launch(quick, phase):
    q = ["--quick"] if quick else []
    return rpc_bench.launch_pair(__file__, " ".join(["serve_bench"] + q + [phase]),
                                 q + [phase], DEADLINE_S[quick], WORLD_SIZE)


def main():
    argv = sys.argv[1:]
    quick = "--quick" in argv
    rank = None
    rest = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--rank":
            if i + 1 >= len(argv) or argv[i + 1] not in map(str, range(WORLD_SIZE)):
                usage(f"--rank needs 0..{WORLD_SIZE - 1}")
            rank = int(argv[i + 1])
            i += 2
            continue
        if a != "--quick":
            rest.append(a)
        i += 1
    if len(rest) > 1 or (rest and rest[0] not in PHASES):
        usage(f"unexpected arguments: {' '.join(rest)}")
    phase = rest[0] if rest else "all"
    if rank is not None:
        worker(rank, quick, phase)
        return 0
    return launch(quick, phase)


if __name__ == "__main__":
    rpc_bench.run_main(main, "serve_bench")
