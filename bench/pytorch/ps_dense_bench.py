#!/usr/bin/python3
"""Benchmark W6 `param_server_dense` on PyTorch RPC (see BENCHMARKS.md).

    ps_dense_bench.py [--quick]

torch.distributed.rpc with the TensorPipe backend, set up exactly as rpc_bench.py
(its launcher helpers and TensorPipe probe are reused from there), with three worker
processes on 127.0.0.1 that this script starts itself (`--rank 0|1|2`, a free
MASTER_PORT each run), one compute thread in each: worker 0 is the parameter server,
workers 1 and 2 are trainers 0 and 1. Built like PyTorch's batch-updating parameter
server tutorial (rpc.functions.async_execution):

- The server object (an RRef owned by worker 0) holds the MLP Linear 784-512-512-10
  with ReLUs, float32, torch's default init from torch.manual_seed(0), and
  torch.optim.SGD(lr 0.01). push_pull(ps_rref, grads) is a static
  @rpc.functions.async_execution method: under a lock it adds the trainer's gradients
  into .grad and returns the step's torch.futures.Future; the second push of a step
  halves the sums (average of the two trainers), runs one SGD step and completes that
  future with the new parameters (a list of tensors), which answers both trainers.
- Each trainer (a Trainer object created on its worker with rpc.remote) draws its
  batch of 64 once (random inputs [64,784] float32 and labels in [0,10) from its own
  generator, seed 1 + trainer; the same batch every step, as gradwire's ps_bench) and
  pulls the parameters once (rpc_sync get_params); then every step: forward and
  backward on the received parameters (torch.autograd.grad), then rpc_sync(push_pull)
  with the gradients, which returns the next step's parameters. So a step moves the
  parameters both ways in one round trip.
- Worker 0 drives: 5 warm-up steps on both trainers, then 100 timed steps each
  (train() started on both with rref.rpc_async(), wall time on worker 0 from before
  the start to both answers). steps_per_s_sum = 2*100 / wall (steps/s);
  param_bytes_per_s = 2 * param_bytes * 2*100 / wall / 1e6 (MB/s, pull and push);
  step_ms_median = trainer 0's median step (ms, for information).
- Check: worker 0 then replays every step in one process through the same server
  class and gradient function, with the trainers' batches; the run fails if its
  parameters differ from the served ones by more than PARAM_ATOL.

--quick: 10 timed steps (smoke test); metric names stay the same.
Result lines go to stdout from worker 0 only, in the format
`workload=param_server_dense impl=pytorch metric=... value=... unit=...`, after
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
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from rpc_bench import line  # noqa: E402

WORKLOAD = "param_server_dense"
WORLD_SIZE = 3               # worker0: server, worker1 and worker2: trainers
TRAINERS = WORLD_SIZE - 1
DEADLINE_S = {False: 300, True: 180}   # whole benchmark, by --quick
ITERS = {False: (5, 100), True: (5, 10)}   # (warm-up, timed) steps per trainer
SIZES = (784, 512, 512, 10)
BATCH, CLASSES = 64, 10
LR = 0.01
BATCH_SEED = 1               # trainer t draws its batch from seed BATCH_SEED + t
PARAM_ATOL = 1e-6            # served vs replayed parameters


def usage(msg):
    print(f"ps_dense_bench: {msg}\nusage: ps_dense_bench.py [--quick]", file=sys.stderr)
    sys.exit(2)


def mlp():
    torch.manual_seed(0)
    layers = []
    for i in range(len(SIZES) - 1):
        layers += [torch.nn.Linear(SIZES[i], SIZES[i + 1]), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def batch(trainer):
    """Trainer's batch (inputs, labels), from its own generator."""
    gen = torch.Generator().manual_seed(BATCH_SEED + trainer)
    x = torch.randn(BATCH, SIZES[0], generator=gen)
    return x, torch.randint(0, CLASSES, (BATCH,), generator=gen)


def gradients(params, x, y):
    """Gradients of the cross-entropy loss of mlp() with these parameters (w1, b1, w2,
    b2, w3, b3 as model.parameters() lists them) on the batch (x, y)."""
    params = [p.detach().requires_grad_() for p in params]
    h = x
    for i in range(0, len(params), 2):
        h = F.linear(h, params[i], params[i + 1])
        if i + 2 < len(params):
            h = F.relu(h)
    return list(torch.autograd.grad(F.cross_entropy(h, y), params))


# ---------------------------------------------------------------- remote objects
# Module-level so every worker resolves them by name (all run this file as __main__).

class ParameterServer:
    def __init__(self):
        self.model = mlp()
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=LR)
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.lock = threading.Lock()
        self.future = torch.futures.Future()
        self.pushed = 0          # pushes of the current step
        self.steps = 0           # SGD steps applied

    def get_params(self):
        return [p.detach() for p in self.params]

    def add_grads(self, grads):
        """This trainer's gradients for the current step; the step's future (done, with
        the new parameters, once every trainer has pushed)."""
        with self.lock, torch.no_grad():
            for p, g in zip(self.params, grads):
                p.grad.add_(g)
            self.pushed += 1
            fut = self.future
            if self.pushed == TRAINERS:
                for p in self.params:
                    p.grad.div_(TRAINERS)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                self.pushed = 0
                self.steps += 1
                self.future = torch.futures.Future()
                # No copy: the next step changes the parameters only after both
                # trainers pushed again, i.e. after they received these.
                fut.set_result(self.get_params())
        return fut

    @staticmethod
    @rpc.functions.async_execution
    def push_pull(ps_rref, grads):
        return ps_rref.local_value().add_grads(grads)


class Trainer:
    def __init__(self, ps_rref, trainer):
        self.ps_rref = ps_rref
        self.batch = batch(trainer)
        self.params = rpc.rpc_sync(ps_rref.owner(), get_params, args=(ps_rref,))

    def train(self, steps):
        """steps synchronous steps; their durations (ms). The received parameter tensors
        are used as they are (no copy into a module)."""
        ms = []
        for _ in range(steps):
            t0 = time.perf_counter()
            grads = gradients(self.params, *self.batch)
            self.params = rpc.rpc_sync(self.ps_rref.owner(), ParameterServer.push_pull,
                                       args=(self.ps_rref, grads))
            ms.append((time.perf_counter() - t0) * 1e3)
        return ms


def get_params(ps_rref):
    return ps_rref.local_value().get_params()


# ---------------------------------------------------------------- worker side

def run_trainers(trainer_cls, ps_rref, warmup, iters):
    """On worker 0: creates trainer_cls(ps_rref, t) on trainer t's worker (rpc.remote),
    runs train(warmup) on all trainers, then train(iters) on all, timed from before the
    calls to the last answer; (the trainers' RRefs, wall seconds of the timed phase,
    each trainer's timed train() result)."""
    trainers = [rpc.remote(f"worker{t + 1}", trainer_cls, args=(ps_rref, t))
                for t in range(TRAINERS)]

    def train_all(steps):
        futs = [tr.rpc_async().train(steps) for tr in trainers]
        torch.futures.wait_all(futs)
        return [f.value() for f in futs]

    train_all(warmup)
    t0 = time.perf_counter()
    results = train_all(iters)
    return trainers, time.perf_counter() - t0, results


def replay(steps):
    """The same synchronous training in this process: the server class fed the
    trainers' gradients directly; its parameters after `steps` steps."""
    server = ParameterServer()
    batches = [batch(t) for t in range(TRAINERS)]
    for _ in range(steps):
        params = server.get_params()
        for x, y in batches:
            fut = server.add_grads(gradients(params, x, y))
        if not fut.done():
            raise RuntimeError("replay: a step's future is not done after every push")
    return server.get_params()


def run(quick):
    warmup, iters = ITERS[quick]
    server = ParameterServer()
    ps_rref = rpc.RRef(server)
    param_bytes = sum(p.numel() * p.element_size() for p in server.params)
    print(f"{WORKLOAD}: MLP {'-'.join(map(str, SIZES))}, {param_bytes} parameter bytes; "
          f"{TRAINERS} trainers, batch {BATCH}; {warmup} warm-up + {iters} timed steps each",
          file=sys.stderr)
    _, wall, ms = run_trainers(Trainer, ps_rref, warmup, iters)
    if server.steps != warmup + iters or server.pushed != 0:
        raise RuntimeError(f"server applied {server.steps} steps ({server.pushed} pushes "
                           f"pending), expected {warmup + iters}")
    worst = max((a - b).abs().max().item()
                for a, b in zip(server.get_params(), replay(warmup + iters)))
    print(f"{WORKLOAD}: wall {wall:.3f} s; trainer step medians "
          f"{', '.join(f'{statistics.median(m):.4g}' for m in ms)} ms; served vs replayed "
          f"parameters: largest difference {worst:.3g}", file=sys.stderr)
    if not worst <= PARAM_ATOL:
        raise RuntimeError(f"served parameters differ from the replayed training by {worst:.3g}"
                           f" (more than {PARAM_ATOL:g})")
    steps_sum = TRAINERS * iters
    return [line(WORKLOAD, "steps_per_s_sum", steps_sum / wall, "steps/s"),
            line(WORKLOAD, "param_bytes_per_s", 2 * param_bytes * steps_sum / wall / 1e6, "MB/s"),
            line(WORKLOAD, "step_ms_median", statistics.median(ms[0]), "ms")]


def worker(rank, quick):
    rpc_bench.run_worker(rank, DEADLINE_S[quick], lambda torch_, rpc_: run(quick), WORLD_SIZE)


# ---------------------------------------------------------------- launcher side

def launch(quick):
    q = ["--quick"] if quick else []
    return rpc_bench.launch_pair(__file__, " ".join(["ps_dense_bench"] + q), q,
                                 DEADLINE_S[quick], WORLD_SIZE)


def main():
    return rpc_bench.quick_main(sys.argv[1:], launch, worker, usage, WORLD_SIZE)


if __name__ == "__main__":
    rpc_bench.run_main(main, "ps_dense_bench")
