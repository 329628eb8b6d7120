#!/usr/bin/python3
"""PyTorch's side of examples/rpc_ps_fashion_mnist.cc (workload rpc_ps_cnn).

    rpc_ps_tutorial.py [--epochs N] [--target 0.90] [--turns]

PyTorch's tutorial "Implementing a Parameter Server Using Distributed RPC Framework"
(pytorch/examples distributed/rpc/parameter_server/rpc_parameter_server.py), adapted
to Fashion-MNIST exactly as the gradwire example is, so that both run the same job:

- 3 processes this script starts itself (rpc_bench.py's launcher: `--rank 0..2`, a free
  MASTER_PORT, TensorPipe, one compute thread each): rank 0 the parameter server
  ("parameter_server" holds the tutorial's Net behind get_parameter_server), ranks 1 and
  2 trainers (TrainerNet: the forward through rpc, NLL loss here, dist_autograd.backward,
  DistributedOptimizer(SGD) over the server's parameter RRefs).
- Data: the IDX files gradwire reads (ps_fashion_mnist_bench.load: float32 in [0, 1]),
  as [N, 1, 28, 28]; trainer t trains on examples i % 2 == t, reshuffled each epoch
  (torch.Generator seeded 1 + t), batch 32. No torchvision.
- Net: the tutorial's (conv 1-32-64, max pool, dropout 0.25, fc 9216-128, dropout 0.5,
  fc 128-10, log_softmax; the tutorial's second Dropout2d on [N, 128] is a Dropout, as
  it behaves). SGD lr 0.03 (the tutorial's) with momentum 0.5 (gradwire's default).
- A step has two phases at the server, as in gradwire's example (ParameterServer in
  examples/rpc_tutorial.h): computing (forward and backward, after begin_step; any
  number of trainers at once, the forwards one at a time) and updating (the optimizer
  step, between begin_update and end_step; alone, once no trainer computes; steps wait
  while an update runs or waits; updates in the order asked). The tutorial as written
  lets updates overlap backward passes and fails with two trainers ("modified by an
  inplace operation", pytorch/tutorials#2095); pytorch/examples#842 makes whole steps
  take turns (`--turns`: that, as gradwire's example did before).
- At every epoch end the trainers meet at the server, trainer 1 evaluates the server's
  model in eval mode in batches of 1000 (rpc "evaluate"), and all stop once it reaches
  --target. Prints `workload=rpc_ps_cnn impl=pytorch metric=time_to_90 value=... unit=s`
  (from the first step to the evaluation that reached the target; nan if never),
  samples_per_s and final_test_acc.
"""
import math
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rpc_bench  # noqa: E402  (runs nothing on import)
from rpc_bench import line  # noqa: E402
from ps_fashion_mnist_bench import load, data_path  # noqa: E402

WORLD_SIZE = 3
WORKLOAD = "rpc_ps_cnn"
TURNS = False  # --turns: whole steps take turns (pytorch/examples#842)
BATCH = 32
LR, MOMENTUM = 0.03, 0.5
DEFAULT_EPOCHS = 5


def make_net():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout2d(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(self.conv2(x), 2)
            x = torch.flatten(self.dropout1(x), 1)
            x = self.dropout2(F.relu(self.fc1(x)))
            return F.log_softmax(self.fc2(x), dim=1)

    torch.manual_seed(0)
    return Net()


# ---------------------------------------------------------------- the server (rank 0)

class ParameterServer:
    def __init__(self):
        self.model = make_net()
        self.forward_lock = threading.Lock()
        self.phases = threading.Condition()
        self.computing = 0          # trainers between begin_step and begin_update
        self.updating = False
        self.updates = []           # tickets of the updates waiting, in the order asked
        self.next_ticket = 0

    def forward(self, x):
        with self.forward_lock:
            return self.model(x)

    def evaluate(self, x):
        import torch
        with self.forward_lock, torch.no_grad():
            self.model.eval()
            try:
                return self.model(x)
            finally:
                self.model.train()

    def get_param_rrefs(self):
        from torch.distributed.rpc import RRef
        return [RRef(p) for p in self.model.parameters()]


param_server = None
global_lock = threading.Lock()
barrier = threading.Condition()
rounds = {}


def get_parameter_server():
    global param_server
    with global_lock:
        if param_server is None:
            param_server = ParameterServer()
        return param_server


def call_method(method, rref, *args):
    return method(rref.local_value(), *args)


def remote_method(method, rref, *args):
    from torch.distributed import rpc
    return rpc.rpc_sync(rref.owner(), call_method, args=[method, rref] + list(args))


def begin_step(ps):
    """Blocks this rpc thread while an update runs or waits; then this trainer computes."""
    with ps.phases:
        if TURNS:
            ps.phases.wait_for(lambda: not ps.updating)
            ps.updating = True
            return True
        ps.phases.wait_for(lambda: not ps.updating and not ps.updates)
        ps.computing += 1
    return True


def begin_update(ps):
    """Stops computing; blocks until this trainer's update may run alone."""
    if TURNS:
        return True
    with ps.phases:
        ps.computing -= 1
        ticket = ps.next_ticket
        ps.next_ticket += 1
        ps.updates.append(ticket)
        ps.phases.notify_all()
        ps.phases.wait_for(lambda: not ps.updating and ps.computing == 0 and ps.updates[0] == ticket)
        ps.updates.pop(0)
        ps.updating = True
    return True


def end_step(ps):
    with ps.phases:
        ps.updating = False
        ps.phases.notify_all()
    return True


def epoch_end(rnd, value, trainers):
    """Returns, once every trainer called it for `rnd`, the largest value given."""
    with barrier:
        r = rounds.setdefault(rnd, {"n": 0, "max": -1e300})
        r["n"] += 1
        r["max"] = max(r["max"], value)
        barrier.notify_all()
        barrier.wait_for(lambda: r["n"] >= trainers)
        return r["max"]


# ---------------------------------------------------------------- a trainer (ranks 1..)

def train(rank, epochs, target):
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.nn.functional as F
    from torch import optim
    from torch.distributed import rpc
    from torch.distributed.optim import DistributedOptimizer

    trainer, trainers = rank - 1, WORLD_SIZE - 1
    images, labels = load("train")
    test_images, test_labels = load("t10k")
    mine = torch.arange(trainer, len(images), trainers)
    images, labels = images[mine].view(-1, 1, 28, 28), labels[mine]
    test_images = test_images.view(-1, 1, 28, 28)
    shuffle = torch.Generator().manual_seed(1 + trainer)

    ps = rpc.remote("worker0", get_parameter_server)
    params = remote_method(ParameterServer.get_param_rrefs, ps)
    opt = DistributedOptimizer(optim.SGD, params, lr=LR, momentum=MOMENTUM)
    show = trainer == 0
    start = time.perf_counter()
    samples, rnd = 0, 0
    test_acc, time_to, samples_to = 0.0, math.nan, 0
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(images), generator=shuffle)
        steps = (len(order) + BATCH - 1) // BATCH
        for i in range(steps):
            idx = order[i * BATCH:(i + 1) * BATCH]
            x, y = images[idx], labels[idx]
            remote_method(begin_step, ps)
            with dist_autograd.context() as cid:
                out = remote_method(ParameterServer.forward, ps, x)
                loss = F.nll_loss(out, y)
                dist_autograd.backward(cid, [loss])
                remote_method(begin_update, ps)
                opt.step(cid)
            remote_method(end_step, ps)
            samples += trainers * len(idx)
            if show and (i % 100 == 0 or i == steps - 1):
                print(f"epoch {epoch}/{epochs} step {i + 1}/{steps} loss={loss.item():.4f} "
                      f"{samples / (time.perf_counter() - start):.0f} samples/s",
                      file=sys.stderr, flush=True)
        rpc.rpc_sync("worker0", epoch_end, args=(rnd, 0.0, trainers))
        rnd += 1
        acc = -1.0
        if show:
            correct = 0
            for s in range(0, len(test_images), 1000):
                out = remote_method(ParameterServer.evaluate, ps, test_images[s:s + 1000])
                correct += (out.argmax(1) == test_labels[s:s + 1000]).sum().item()
            acc = correct / len(test_images)
        test_acc = rpc.rpc_sync("worker0", epoch_end, args=(rnd, acc, trainers))
        rnd += 1
        if show:
            print(f"epoch {epoch}/{epochs}: test_acc={test_acc:.4f} "
                  f"({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
        if test_acc >= target:
            time_to, samples_to = time.perf_counter() - start, samples
            break
    wall = time.perf_counter() - start
    if not show:
        return []
    return [line(WORKLOAD, "time_to_90", time_to, "s"),
            line(WORKLOAD, "samples_per_s", samples_to / time_to if samples_to else samples / wall,
                 "samples/s"),
            line(WORKLOAD, "final_test_acc", test_acc, "fraction")]


def worker(rank, epochs, target):
    import torch
    from torch.distributed import rpc
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(rpc_timeout=600)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD_SIZE, rpc_backend_options=opts)
    lines = train(rank, epochs, target) if rank > 0 else []
    rpc.shutdown()
    for ln in lines:
        print(ln)
    sys.stdout.flush()


def main():
    global TURNS
    argv = sys.argv[1:]
    epochs, target, rank, args = DEFAULT_EPOCHS, 0.90, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--turns":
            TURNS = True
            args.append(a)
            i += 1
            continue
        if a in ("--epochs", "--target", "--rank") and i + 1 < len(argv):
            v = argv[i + 1]
            if a == "--epochs":
                epochs = int(v)
                args += [a, v]
            elif a == "--target":
                target = float(v)
                args += [a, v]
            else:
                rank = int(v)
            i += 2
            continue
        print(f"rpc_ps_tutorial: unexpected argument {a}\nusage: rpc_ps_tutorial.py [--epochs N] "
              f"[--target 0.90] [--turns]", file=sys.stderr)
        return 2
    if rank is not None:
        worker(rank, epochs, target)
        return 0
    missing = [p for split in ("train", "t10k") for kind in ("images", "labels")
               if not os.path.exists(p := data_path(split, kind))]
    if missing:
        print(f"rpc_ps_tutorial: error: {', '.join(missing)} not found; install the Debian "
              f"package dataset-fashion-mnist", file=sys.stderr)
        return 2
    return rpc_bench.launch_pair(__file__, " ".join(["rpc_ps_tutorial"] + args), args,
                                 60 + 400 * epochs, WORLD_SIZE)


if __name__ == "__main__":
    rpc_bench.run_main(main, "rpc_ps_tutorial")
