#!/usr/bin/python3
"""Benchmark W9 `fashion_mnist_ps` on PyTorch RPC (see BENCHMARKS.md).

    ps_fashion_mnist_bench.py [--quick] [--epochs N] [--keep-going]

The PyTorch side of gradwire's examples/ps_fashion_mnist.cc: parameter-server training
of an MLP 784-256-128-10 (ReLU) on Fashion-MNIST, 2 servers and 2 trainers, batch 64
per trainer, synchronous SGD (momentum 0.9, lr 0.05). torch.distributed.rpc with the
TensorPipe backend, set up exactly as rpc_bench.py (its launcher helpers and TensorPipe
probe are reused from there) and structured like ps_dense_bench.py: four worker
processes on 127.0.0.1 that this script starts itself (`--rank 0..3`, a free
MASTER_PORT each run), one compute thread in each. Workers 0 and 1 are servers 0 and
1, workers 2 and 3 are trainers 0 and 1; worker 0 also drives.

- Data: the IDX gz files of the Debian package dataset-fashion-mnist
  (/usr/share/datasets/fashion-mnist), images float32 [N, 784] scaled to [0, 1], labels
  int64, as gradwire's LoadFashionMnist. Trainer t trains on the examples i with
  i % 2 == t (gradwire's DataLoader::Shard), reshuffled at every epoch start from its
  own generator (seed 1 + t, as gradwire's seed + 1 + trainer; torch.randperm instead
  of gradwire's Fisher-Yates, so the same scheme, not the same order); batches of 64,
  the last one of an epoch smaller (30000 = 468 * 64 + 48, 469 steps an epoch, not
  dropped, as gradwire).
- Model and initialisation: torch.manual_seed(0), torch.nn.Linear's default init,
  which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases: the distribution
  gradwire's nn::Linear draws from (not the same numbers). Parameters in the order
  w1, b1, w2, b2, w3, b3 (235,146 float32).
- Sharding: as gradwire's dense tables (param_server/sharding.h ShardDense), every
  parameter tensor is flattened and split into two contiguous halves, the first half
  on server 0, the second on server 1 (the first numel % 2 elements extra go to server
  0; here every size is even), so both servers hold exactly half of the bytes and a
  step sends one message to each server, both in flight at once (gradwire's
  PushPullMany).
- Server (a ParameterServer object per server worker, created by worker 0 with
  rpc.remote) holds its halves as leaf tensors with torch.optim.SGD(lr 0.05, momentum
  0.9). push_pull(ps_rref, step, grads) is a static @rpc.functions.async_execution
  method, PyTorch's batch-updating parameter-server pattern: under a lock it adds the
  trainer's gradient halves into .grad and returns the step's torch.futures.Future;
  the second push of a step halves the sums (mean of the two trainers' batch-mean
  gradients, as gradwire's kSync tables), runs one SGD step and completes that future
  with the new halves, which answers both trainers. `step` is checked against the
  server's step count (a lost or duplicated push fails the run).
- Trainer (a Trainer object created by worker 0 with rpc.remote on its worker) loads
  the data and pulls the initial parameters from both servers when created (before
  the clock starts). Every step: forward and cross-entropy loss (mean) on the batch
  with the current parameters (F.linear, torch.autograd.grad), then rpc_async
  push_pull to both servers with the gradient halves, wait for both, and concatenate
  the answered halves into the next step's parameters.
- Evaluation schedule, as gradwire: once at the end of every epoch (after the
  epoch's 469 synchronous steps), trainer 0 computes the test accuracy on all 10,000
  test images with the parameters the servers hold after that epoch (the ones the
  last push_pull answered). Evaluation time counts in the wall time (in gradwire it
  is inside the timed loop too).
- Timing: worker 0 calls train_epoch on both trainers (rref.rpc_async()) one epoch at
  a time. The clock starts after setup (data loaded, servers and trainers created,
  initial parameters pulled), just before epoch 1, as gradwire starts it after its
  setup and initial pull. time_to_85 = wall seconds from there to the end of the first
  epoch whose test accuracy is >= 0.85 (including that evaluation); samples_per_s =
  training samples processed by both trainers up to that point / time_to_85;
  final_test_acc = the test accuracy at the end of the run. The run stops after the
  epoch that reaches 0.85, or after --epochs epochs (default 10, gradwire's default),
  whichever first; --keep-going trains all --epochs epochs anyway (as the gradwire
  example always does; time_to_85 is still the first crossing). Reaching the end
  without 0.85 prints the metric lines (time_to_85=nan) and exits 1.
- Check: the servers' step counts must equal the steps the trainers made.

--quick: one epoch cut to 200 steps per trainer, then the evaluation (smoke test; the
metric lines are printed; if 0.85 is not reached, time_to_85 is nan and samples_per_s
is taken over the whole run, noted on stderr, exit status 0).
Per-epoch progress (trainer 0's mean training loss and accuracy, test accuracy,
samples/s) goes to stderr. Result lines go to stdout from worker 0 only, in the format
`workload=fashion_mnist_ps impl=pytorch metric=... value=... unit=...`, after
rpc.shutdown(). Every loop is bounded; a watchdog in each worker and a deadline in the
launcher end a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import gzip
import math
import os
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from rpc_bench import line  # noqa: E402

WORKLOAD = "fashion_mnist_ps"
SERVERS, TRAINERS = 2, 2
WORLD_SIZE = SERVERS + TRAINERS   # worker0, worker1: servers; worker2, worker3: trainers
SIZES = (784, 256, 128, 10)
BATCH = 64
LR, MOMENTUM = 0.05, 0.9
SEED = 0                     # model init torch.manual_seed(SEED); trainer t shuffles with SEED + 1 + t
TARGET_ACC = 0.85
DEFAULT_EPOCHS = 10
QUICK_STEPS = 200            # --quick: steps per trainer (one cut epoch)
DATA_DIR = "/usr/share/datasets/fashion-mnist"   # Debian package dataset-fashion-mnist
FAILED = []                  # on worker 0: why the run failed after printing its lines


def deadline_s(quick, epochs):
    """Whole benchmark (the launcher's deadline; each worker's watchdog fires 10 s before)."""
    return 180 if quick else 180 + 60 * epochs


def usage(msg):
    print(f"ps_fashion_mnist_bench: {msg}\nusage: ps_fashion_mnist_bench.py [--quick] "
          f"[--epochs N] [--keep-going]", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- data and model

def read_idx(path, magic):
    """The array of an IDX file (gzip-compressed), checking its magic number and size."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if len(data) < 8 or int.from_bytes(data[0:4], "big") != magic:
        raise RuntimeError(f"'{path}' is not an IDX file of type {magic:#x}")
    n = int.from_bytes(data[4:8], "big")
    if magic == 0x803:
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        if len(data) - 16 != n * rows * cols:
            raise RuntimeError(f"'{path}': header says {n} images of {rows}x{cols}, "
                               f"file holds {len(data) - 16} pixel bytes")
        return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, rows * cols)
    if len(data) - 8 != n:
        raise RuntimeError(f"'{path}': header says {n} labels, file holds {len(data) - 8}")
    return np.frombuffer(data, dtype=np.uint8, offset=8)


def data_path(prefix, kind):
    return os.path.join(DATA_DIR, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz")


def load(split):
    """(images float32 [N, 784] in [0, 1], labels int64 [N]) of 'train' or 't10k'."""
    images = read_idx(data_path(split, "images"), 0x803)
    labels = read_idx(data_path(split, "labels"), 0x801)
    if len(images) != len(labels):
        raise RuntimeError(f"{split}: {len(images)} images but {len(labels)} labels")
    return (torch.from_numpy(images.astype(np.float32) / np.float32(255)),
            torch.from_numpy(labels.astype(np.int64)))


def initial_params():
    """w1, b1, w2, b2, w3, b3 of the MLP, torch's default init from torch.manual_seed(SEED)."""
    torch.manual_seed(SEED)
    return [p.detach() for i in range(len(SIZES) - 1)
            for p in torch.nn.Linear(SIZES[i], SIZES[i + 1]).parameters()]


def forward(params, x):
    h = x
    for i in range(0, len(params), 2):
        h = F.linear(h, params[i], params[i + 1])
        if i + 2 < len(params):
            h = F.relu(h)
    return h


def shard_range(numel, server):
    """[begin, end) of a flat tensor of numel elements held by `server` (gradwire's
    ShardDense: contiguous ranges in server order, the first numel % SERVERS one longer)."""
    base, longer = divmod(numel, SERVERS)
    begin = server * base + min(server, longer)
    return begin, begin + base + (1 if server < longer else 0)


# ---------------------------------------------------------------- remote objects
# Module-level so every worker resolves them by name (all run this file as __main__).

class ParameterServer:
    def __init__(self, server):
        self.server = server
        self.shards = []
        for p in initial_params():
            begin, end = shard_range(p.numel(), server)
            self.shards.append(p.reshape(-1)[begin:end].clone().requires_grad_())
        self.optimizer = torch.optim.SGD(self.shards, lr=LR, momentum=MOMENTUM)
        for p in self.shards:
            p.grad = torch.zeros_like(p)
        self.lock = threading.Lock()
        self.future = torch.futures.Future()
        self.pushed = 0          # pushes of the current step
        self.steps = 0           # SGD steps applied

    def get_params(self):
        return [p.detach() for p in self.shards]

    def applied(self):
        return self.steps, self.pushed

    def add_grads(self, step, grads):
        """This trainer's gradient halves for step `step`; the step's future (done, with
        the new halves, once every trainer has pushed)."""
        with self.lock, torch.no_grad():
            if step != self.steps:
                raise RuntimeError(f"server {self.server}: push for step {step}, but the "
                                   f"current step is {self.steps}")
            for p, g in zip(self.shards, grads):
                p.grad.add_(g)
            self.pushed += 1
            fut = self.future
            if self.pushed == TRAINERS:
                for p in self.shards:
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
    def push_pull(ps_rref, step, grads):
        return ps_rref.local_value().add_grads(step, grads)


def get_params(ps_rref):
    return ps_rref.local_value().get_params()


class Trainer:
    def __init__(self, ps_rrefs, trainer, evaluate):
        self.ps_rrefs = ps_rrefs
        self.trainer = trainer
        images, labels = load("train")
        shard = torch.arange(trainer, len(labels), TRAINERS)    # i % TRAINERS == trainer
        self.images, self.labels = images[shard].contiguous(), labels[shard].contiguous()
        self.test = load("t10k") if evaluate else None
        self.gen = torch.Generator().manual_seed(SEED + 1 + trainer)
        self.shapes = [p.shape for p in initial_params()]
        self.params = self.assemble([rpc.rpc_sync(r.owner(), get_params, args=(r,))
                                     for r in ps_rrefs])
        self.step = 0

    def ready(self):
        return len(self.labels)

    def assemble(self, halves):
        """The full parameters from the servers' halves (one list of tensors per server)."""
        return [torch.cat([h[t] for h in halves]).view(shape)
                for t, shape in enumerate(self.shapes)]

    def train_epoch(self, max_steps):
        """One epoch over this trainer's shard, reshuffled (at most max_steps steps);
        (steps, samples, mean loss, training accuracy, test accuracy or None)."""
        order = torch.randperm(len(self.labels), generator=self.gen)
        loss_sum, correct, seen, steps = 0.0, 0, 0, 0
        for begin in range(0, len(order), BATCH):
            if steps == max_steps:
                break
            idx = order[begin:begin + BATCH]
            x, y = self.images[idx], self.labels[idx]
            params = [p.detach().requires_grad_() for p in self.params]
            logits = forward(params, x)
            loss = F.cross_entropy(logits, y)
            grads = torch.autograd.grad(loss, params)
            futs = []
            for s, r in enumerate(self.ps_rrefs):
                halves = []
                for g in grads:
                    begin_s, end_s = shard_range(g.numel(), s)
                    halves.append(g.reshape(-1)[begin_s:end_s])
                futs.append(rpc.rpc_async(r.owner(), ParameterServer.push_pull,
                                          args=(r, self.step, halves)))
            self.params = self.assemble([f.wait() for f in futs])
            self.step += 1
            steps += 1
            loss_sum += loss.item()
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
        test_acc = None
        if self.test is not None:
            with torch.no_grad():
                images, labels = self.test
                test_acc = (forward(self.params, images).argmax(1) == labels).float().mean().item()
        return steps, seen, loss_sum / max(steps, 1), correct / max(seen, 1), test_acc


# ---------------------------------------------------------------- worker side

def run(quick, epochs, keep_going):
    max_steps = QUICK_STEPS if quick else None
    if quick:
        epochs = 1
    servers = [rpc.remote(f"worker{s}", ParameterServer, args=(s,)) for s in range(SERVERS)]
    trainers = [rpc.remote(f"worker{SERVERS + t}", Trainer, args=(servers, t, t == 0))
                for t in range(TRAINERS)]
    shard_sizes = [tr.rpc_sync().ready() for tr in trainers]   # data loaded, parameters pulled
    n_params = sum(p.numel() for p in initial_params())
    print(f"{WORKLOAD}: MLP {'-'.join(map(str, SIZES))}, {n_params} parameters, halves of "
          f"every tensor on {SERVERS} servers; {TRAINERS} trainers with {shard_sizes} "
          f"training examples, batch {BATCH}, SGD lr {LR} momentum {MOMENTUM}; "
          + (f"--quick: {QUICK_STEPS} steps" if quick else
             f"at most {epochs} epochs" + ("" if keep_going else f", stop at {TARGET_ACC}")),
          file=sys.stderr, flush=True)

    timeout = deadline_s(quick, epochs)
    t0 = time.perf_counter()
    samples = steps = 0
    time_to, samples_to = math.nan, 0
    test_acc = math.nan
    for epoch in range(1, epochs + 1):
        e0 = time.perf_counter()
        futs = [tr.rpc_async(timeout=timeout).train_epoch(max_steps) for tr in trainers]
        results = [f.wait() for f in futs]
        now = time.perf_counter()
        if len({r[0] for r in results}) != 1:
            raise RuntimeError(f"epoch {epoch}: the trainers made {[r[0] for r in results]} steps")
        steps += results[0][0]
        samples += sum(r[1] for r in results)
        _, _, loss, train_acc, test_acc = results[0]
        print(f"{WORKLOAD}: epoch {epoch}/{epochs}: {results[0][0]} steps, loss={loss:.4f} "
              f"acc={train_acc:.4f} test_acc={test_acc:.4f}, "
              f"{sum(r[1] for r in results) / (now - e0):.0f} samples/s, {now - t0:.2f} s",
              file=sys.stderr, flush=True)
        if math.isnan(time_to) and test_acc >= TARGET_ACC:
            time_to, samples_to = now - t0, samples
            if not keep_going:
                break
    wall = time.perf_counter() - t0
    for s, r in enumerate(servers):
        applied, pushed = r.rpc_sync().applied()
        if applied != steps or pushed != 0:
            raise RuntimeError(f"server {s} applied {applied} steps ({pushed} pushes pending), "
                               f"the trainers made {steps}")
    print(f"{WORKLOAD}: {steps} steps per trainer, {samples} samples in {wall:.2f} s "
          f"({samples / wall:.0f} samples/s); final test accuracy {test_acc:.4f}; "
          + (f"{TARGET_ACC} reached after {time_to:.2f} s" if not math.isnan(time_to)
             else f"{TARGET_ACC} not reached"), file=sys.stderr, flush=True)
    if math.isnan(time_to):
        print(f"{WORKLOAD}: note: test accuracy {test_acc:.4f} < {TARGET_ACC}: time_to_85=nan, "
              f"samples_per_s over the whole run", file=sys.stderr)
        samples_per_s = samples / wall
        if not quick:
            FAILED.append(f"test accuracy {test_acc:.4f} did not reach {TARGET_ACC} "
                          f"in {epochs} epochs")
    else:
        samples_per_s = samples_to / time_to
    return [line(WORKLOAD, "time_to_85", time_to, "s"),
            line(WORKLOAD, "samples_per_s", samples_per_s, "samples/s"),
            line(WORKLOAD, "final_test_acc", test_acc, "fraction")]


def worker(rank, quick, epochs, keep_going):
    rpc_bench.run_worker(rank, deadline_s(quick, epochs),
                         lambda torch_, rpc_: run(quick, epochs, keep_going), WORLD_SIZE)
    if FAILED:
        print(f"ps_fashion_mnist_bench: error: {FAILED[0]}", file=sys.stderr)
        sys.exit(1)


# ---------------------------------------------------------------- launcher side

def launch(quick, epochs, keep_going, args):
    missing = [p for split in ("train", "t10k") for kind in ("images", "labels")
               if not os.path.exists(p := data_path(split, kind))]
    if missing:
        print(f"ps_fashion_mnist_bench: error: {', '.join(missing)} not found; install the "
              f"Debian package dataset-fashion-mnist", file=sys.stderr)
        return 2
    return rpc_bench.launch_pair(__file__, " ".join(["ps_fashion_mnist_bench"] + args), args,
                                 deadline_s(quick, epochs), WORLD_SIZE)


def main():
    argv = sys.argv[1:]
    quick = keep_going = False
    epochs, rank = DEFAULT_EPOCHS, None
    args = []                # passed on to the workers
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--quick":
            quick = True
            args.append(a)
        elif a == "--keep-going":
            keep_going = True
            args.append(a)
        elif a in ("--epochs", "--rank"):
            if i + 1 >= len(argv) or not argv[i + 1].isdigit():
                usage(f"{a} needs a number")
            value = int(argv[i + 1])
            if a == "--epochs":
                if not 1 <= value <= 1000:
                    usage("--epochs must be in [1, 1000]")
                epochs = value
                args += [a, argv[i + 1]]
            else:
                if value >= WORLD_SIZE:
                    usage(f"--rank must be below {WORLD_SIZE}")
                rank = value
            i += 1
        else:
            usage(f"unexpected argument: {a}")
        i += 1
    if rank is not None:
        worker(rank, quick, epochs, keep_going)
        return 0
    return launch(quick, epochs, keep_going, args)


if __name__ == "__main__":
    rpc_bench.run_main(main, "ps_fashion_mnist_bench")
