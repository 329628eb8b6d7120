#!/usr/bin/python3
"""Produces dist_autograd/tests/data/w8_reference.txt (test W8 `grad_oracle`) with PyTorch.

    /usr/bin/python3 dist_autograd/tests/make_reference.py [OUT]   (default: data/w8_reference.txt
                                                                     next to this script)

The model (float64, deterministic values, no RNG), the same one the C++ test rebuilds:
  x [4,6]    x[i][j]   = sin(0.3*(i*6+j) + 0.1)                  worker0, requires grad
  W_a [6,5]  W_a[i][j] = 0.2*cos(0.7*(i*5+j) + 0.2)              worker0, requires grad
  b_a [5]    b_a[j]    = 0.05*(j-2)                              worker0, requires grad
  W_b [5,3]  W_b[i][j] = 0.3*sin(0.5*(i*3+j) + 0.3)              worker1, a leaf requiring grad
  target [4,3]  target[i][j] = 0.1*(i-j)
  h = tanh(x @ W_a + b_a) on worker0; out = h @ W_b on worker1 (rpc_sync to a function there
  that holds W_b); loss = mean((out - target)**2) on worker0.

It runs the model twice: (1) with torch.distributed.rpc (TensorPipe, two worker processes on
127.0.0.1 that this script starts itself, launcher helpers from bench/pytorch/rpc_bench.py)
inside a dist_autograd context, dist_autograd.backward(ctx_id, [loss]); the gradients of x,
W_a, b_a are read with dist_autograd.get_gradients(ctx_id) on worker0 and the one of W_b by an
rpc to worker1 that reads get_gradients(ctx_id) there (each worker must hold exactly its own
leaves' gradients); (2) in this process with loss.backward(). The two must agree to 1e-12.
Output: a '#' comment line, then one line each `<name> <values row-major...>` with
repr-exact floats: w8.loss, w8.grad.x, w8.grad.w_a, w8.grad.b_a, w8.grad.w_b, w8.out.
Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import faulthandler
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "pytorch"))
import rpc_bench  # noqa: E402  (runs nothing on import)

WORLD_SIZE = rpc_bench.WORLD_SIZE
DEADLINE_S = 180
TOL = 1e-12
NAMES = ("loss", "grad.x", "grad.w_a", "grad.b_a", "grad.w_b", "out")
SIZES = {"loss": 1, "grad.x": 24, "grad.w_a": 30, "grad.b_a": 5, "grad.w_b": 15, "out": 12}


def det(torch, rows, cols, f):
    return torch.tensor([[f(i, j) for j in range(cols)] for i in range(rows)],
                        dtype=torch.float64)


def make_x(torch):
    return det(torch, 4, 6, lambda i, j: math.sin(0.3 * (i * 6 + j) + 0.1))


def make_w_a(torch):
    return det(torch, 6, 5, lambda i, j: 0.2 * math.cos(0.7 * (i * 5 + j) + 0.2))


def make_b_a(torch):
    return torch.tensor([0.05 * (j - 2) for j in range(5)], dtype=torch.float64)


def make_w_b(torch):
    return det(torch, 5, 3, lambda i, j: 0.3 * math.sin(0.5 * (i * 3 + j) + 0.3))


def make_target(torch):
    return det(torch, 4, 3, lambda i, j: 0.1 * (i - j))


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


# ---------------------------------------------------------------- worker 1 side
# Module-level so worker 0 names them in rpc calls (both workers run this file as __main__).

W_B = None   # worker 1's leaf, set in worker()


def second_layer(h):
    return h @ W_B


def w_b_grads(ctx_id):
    """Worker 1's gradients in the context: [grad of W_B, how many tensors have one]."""
    import torch.distributed.autograd as dist_autograd
    grads = dist_autograd.get_gradients(ctx_id)
    if W_B not in grads:
        raise RuntimeError(f"worker1: no gradient for W_b in context {ctx_id}")
    return [grads[W_B], len(grads)]


# ---------------------------------------------------------------- workers

def distributed_run(torch, rpc, dist_autograd):
    x = make_x(torch).requires_grad_()
    w_a = make_w_a(torch).requires_grad_()
    b_a = make_b_a(torch).requires_grad_()
    target = make_target(torch)
    with dist_autograd.context() as ctx_id:
        h = torch.tanh(x @ w_a + b_a)
        out = rpc.rpc_sync("worker1", second_layer, args=(h,))
        loss = torch.mean((out - target) ** 2)
        dist_autograd.backward(ctx_id, [loss])
        grads = dist_autograd.get_gradients(ctx_id)
        missing = [n for n, t in (("x", x), ("W_a", w_a), ("b_a", b_a)) if t not in grads]
        if missing or len(grads) != 3:
            raise RuntimeError(f"worker0: gradients in the context for {len(grads)} tensors, "
                               f"missing {missing}; want exactly x, W_a, b_a")
        for t in (x, w_a, b_a):
            if t.grad is not None:
                raise RuntimeError("worker0: dist_autograd.backward wrote a .grad field")
        g_w_b, n_remote = rpc.rpc_sync("worker1", w_b_grads, args=(ctx_id,))
        if n_remote != 1:
            raise RuntimeError(f"worker1: gradients for {n_remote} tensors, want only W_b")
        print("make_reference: gradients of x, W_a, b_a held by worker0, of W_b by worker1 "
              "(get_gradients on each)", file=sys.stderr)
        return {"loss": flat(loss), "grad.x": flat(grads[x]), "grad.w_a": flat(grads[w_a]),
                "grad.b_a": flat(grads[b_a]), "grad.w_b": flat(g_w_b), "out": flat(out)}


def worker(rank, result_path):
    global W_B
    faulthandler.dump_traceback_later(DEADLINE_S - 10, exit=True)
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    torch.set_num_threads(1)
    if rank == 1:
        W_B = make_w_b(torch).requires_grad_()
    opts = rpc.TensorPipeRpcBackendOptions(rpc_timeout=rpc_bench.RPC_TIMEOUT_S)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=WORLD_SIZE, rpc_backend_options=opts)
    result = distributed_run(torch, rpc, dist_autograd) if rank == 0 else None
    rpc.shutdown()
    if result is not None:
        with open(result_path, "w") as f:
            for name in NAMES:
                f.write(name + " " + " ".join(repr(v) for v in result[name]) + "\n")
    faulthandler.cancel_dump_traceback_later()


# ---------------------------------------------------------------- launcher

def local_run(torch):
    x = make_x(torch).requires_grad_()
    w_a = make_w_a(torch).requires_grad_()
    b_a = make_b_a(torch).requires_grad_()
    w_b = make_w_b(torch).requires_grad_()
    h = torch.tanh(x @ w_a + b_a)
    out = h @ w_b
    loss = torch.mean((out - make_target(torch)) ** 2)
    loss.backward()
    return {"loss": flat(loss), "grad.x": flat(x.grad), "grad.w_a": flat(w_a.grad),
            "grad.b_a": flat(b_a.grad), "grad.w_b": flat(w_b.grad), "out": flat(out)}


def distributed_results():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "dist.txt")
        env = rpc_bench.child_env()
        why = rpc_bench.wait_pair(rpc_bench.start_pair([path], env, script=__file__),
                                  DEADLINE_S)
        if why:
            raise RuntimeError(f"distributed run failed: {why}")
        with open(path) as f:
            return {ln.split()[0]: [float(v) for v in ln.split()[1:]] for ln in f if ln.strip()}


def compare(torch):
    """PyTorch's distributed results, its local ones, and the largest difference."""
    torch.set_num_threads(1)
    dist = distributed_results()
    local = local_run(torch)
    worst = 0.0
    for name in NAMES:
        d, l = dist.get(name, []), local[name]
        if len(d) != SIZES[name] or len(l) != SIZES[name]:
            raise RuntimeError(f"{name}: {len(d)} distributed / {len(l)} local values, "
                               f"want {SIZES[name]}")
        for i, (a, b) in enumerate(zip(d, l)):
            if not abs(a - b) <= TOL:
                raise RuntimeError(f"{name}[{i}]: distributed {a!r} != local {b!r}")
            worst = max(worst, abs(a - b))
    return dist, local, worst


def bench():
    """W8 for bench/run: PyTorch's side of the gradient oracle."""
    import torch
    dist, _, worst = compare(torch)
    print(f"workload=grad_oracle impl=pytorch metric=loss value={dist['loss'][0]!r} unit=1")
    print(f"workload=grad_oracle impl=pytorch metric=max_abs_diff_dist_vs_local value={worst!r} unit=1")
    return 0


def launch(out_path):
    import torch
    dist, local, worst = compare(torch)
    print(f"make_reference: distributed and local agree, largest difference {worst:.3g} "
          f"(tolerance {TOL:g})", file=sys.stderr)
    rel = os.path.relpath(os.path.abspath(__file__), os.path.join(HERE, "..", ".."))
    with open(out_path, "w") as f:
        f.write(f"# Produced by `/usr/bin/python3 {rel}` with torch {torch.__version__} "
                f"(Debian python3-torch): dist_autograd over TensorPipe RPC between two "
                f"processes, checked against local loss.backward() to {TOL:g}; float64.\n")
        for name in NAMES:
            f.write(f"w8.{name} " + " ".join(repr(v) for v in local[name]) + "\n")
    print(f"make_reference: wrote {out_path}", file=sys.stderr)
    return 0


def main():
    argv = sys.argv[1:]
    if len(argv) == 3 and argv[0] == "--rank" and argv[1] in ("0", "1"):
        worker(int(argv[1]), argv[2])
        return 0
    if argv == ["--bench"]:
        return bench()
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: make_reference.py [OUT | --bench]", file=sys.stderr)
        return 2
    return launch(argv[0] if argv else os.path.join(HERE, "data", "w8_reference.txt"))


if __name__ == "__main__":
    rpc_bench.run_main(main, "make_reference")
