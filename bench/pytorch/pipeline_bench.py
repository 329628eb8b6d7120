#!/usr/bin/python3
"""Benchmark W12 `pipeline_mlp` on PyTorch (see BENCHMARKS.md).

    pipeline_bench.py [--quick]

W5's model and batch, taken from model_parallel_bench.py (full_model(): Linear
1024-1024-1024-1024-10 with ReLUs, float32, torch.manual_seed(0); stage 0 =
Linear(1024,1024)+ReLU+Linear(1024,1024)+ReLU, stage 1 = Linear(1024,1024)+ReLU+
Linear(1024,10); batch 128 random inputs and labels, seed 1), trained with SGD lr 0.01
on cross-entropy. Every pipeline rebuilds the model from the same seed, so each run
starts from the same weights. Three things are measured, each 5 warm-up + 30 timed
iterations, median ms per iteration; every process runs one compute thread
(torch.set_num_threads(1), OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1):

- local_ms_per_iter: the local floor, the whole model in one process (worker 0 of
  the pair below, while worker 1 idles), model_parallel_bench's step: forward,
  loss.backward(), torch.optim.SGD step, zero_grad.
- rpc_gpipe_ms_per_iter_chunks<k>, k = 1, 4, 8: a GPipe written with PyTorch RPC.
  Two worker processes set up exactly as rpc_bench.py's (TensorPipe backend, its
  launcher helpers and TensorPipe probe reused, 127.0.0.1, a free MASTER_PORT each
  run): worker 0 is the driver and keeps stage 0; stage 1 is an nn.Sequential created
  on worker 1 with rpc.remote (an RRef owned by worker 1), as in model_parallel_bench.
  One iteration = `with dist_autograd.context()`: the batch is split into k
  micro-batches (torch.chunk); for each, stage 0's forward runs on worker 0, then
  stage 1's is sent with rref.rpc_async().forward(h), so worker 1 computes
  micro-batch m while worker 0 computes m+1; after waiting for all, loss = sum over
  micro-batches m of cross_entropy(out_m, y_m) * len_m / 128 (the full batch's mean),
  dist_autograd.backward(ctx, [loss]), DistributedOptimizer(SGD, lr 0.01).step(ctx),
  the optimizer built once a k over RRefs of both stages' parameters.
- torchpipe_ms_per_iter_chunks<k>: torch.distributed.pipeline.sync.Pipe on CPU, in a
  third process started afterwards on its own (RPC initialised with world_size 1,
  as Pipe requires), over nn.Sequential(stage 0, stage 1), chunks=k,
  checkpoint="never". One iteration = zero_grad, pipe(x).local_value(), cross-entropy,
  loss.backward(), torch.optim.SGD step. On CPU both partitions are on device "cpu",
  and Pipe starts one worker thread a device, so the two stages share that one thread
  (and one core: one compute thread in this process too) and never overlap: this
  peer measures Pipe's micro-batching machinery, not two stages at work. If Pipe
  cannot run in this torch build, why goes to stderr and its lines are left out.
- pipe_ms_per_iter_chunks<k>: the lower of rpc_gpipe and torchpipe for that k (the
  best PyTorch pipeline), or rpc_gpipe alone without Pipe.

Correctness: the first two losses of each pipeline (before and after one SGD step)
must equal the local floor's within LOSS_RTOL (relative), else the run fails.

--quick: 2 warm-up + 5 timed (smoke test); metric names stay the same.
Result lines go to stdout only, in the format
`workload=pipeline_mlp impl=pytorch metric=... value=... unit=ms`: worker 0 of the pair
prints local_ms_per_iter and rpc_gpipe_* after rpc.shutdown(); the Pipe process then
prints torchpipe_* and pipe_ms_per_iter_chunks<k> (worker 0's numbers reach it through
a file in a temporary directory named by $PIPELINE_BENCH_RESULTS). Notes go to stderr.
Every loop is bounded; a watchdog in each worker and a deadline in the launcher end
a hung run. Exit status 0 on success, non-zero (error on stderr) otherwise.
"""
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_parallel_bench as w5  # noqa: E402  (runs nothing on import)
import rpc_bench  # noqa: E402  (runs nothing on import)
from local_mlp import blas_core  # noqa: E402  (runs nothing on import)
from rpc_bench import line  # noqa: E402

WORKLOAD = "pipeline_mlp"
DEADLINE_S = {False: 300, True: 180}       # the worker pair, by --quick
PIPE_DEADLINE_S = {False: 240, True: 120}  # the Pipe process, by --quick
ITERS = {False: (5, 30), True: (2, 5)}     # (warm-up, timed), by --quick
CHUNKS = (1, 4, 8)
CHECKED_LOSSES = 2   # the first losses compared with the local floor's
LOSS_RTOL = w5.LOSS_RTOL
RESULTS_ENV = "PIPELINE_BENCH_RESULTS"


def usage(msg):
    print(f"pipeline_bench: {msg}\nusage: pipeline_bench.py [--quick]", file=sys.stderr)
    sys.exit(2)


def note(msg):
    print(f"{WORKLOAD}: {msg}", file=sys.stderr, flush=True)


def batch(torch):
    torch.manual_seed(1)
    return torch.randn(w5.BATCH, w5.WIDTH), torch.randint(0, w5.CLASSES, (w5.BATCH,))


def check_losses(what, losses, local_losses):
    """Fails unless the first CHECKED_LOSSES losses match the local floor's."""
    pairs = list(zip(losses, local_losses))[:CHECKED_LOSSES]
    worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in pairs)
    note(f"{what}: losses {', '.join(f'{a:.6g}' for a, _ in pairs)} (local "
         f"{', '.join(f'{b:.6g}' for _, b in pairs)}); largest relative difference {worst:.3g}")
    if not worst <= LOSS_RTOL:
        raise RuntimeError(f"{what}: first losses part from the local floor's by {worst:.3g} "
                           f"(relative), more than {LOSS_RTOL:g}: it does not train like the "
                           f"local model")


def summary(what, ms):
    med = statistics.median(ms)
    note(f"{what}: median {med:.4g} ms (min {ms[0]:.4g}, max {ms[-1]:.4g})")
    return med


# ---------------------------------------------------------------- worker pair (RPC GPipe)

def bench_gpipe(torch, rpc, x, y, chunks, warmup, iters):
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.optim import DistributedOptimizer
    stage0 = w5.full_model()[:w5.SPLIT]
    stage1 = rpc.remote("worker1", w5.make_stage1)
    remote_params = rpc.rpc_sync("worker1", w5.param_rrefs, args=(stage1,))
    opt = DistributedOptimizer(torch.optim.SGD,
                               [rpc.RRef(p) for p in stage0.parameters()] + remote_params,
                               lr=w5.LR)
    # The RRef proxy sends its rpc_async from a callback of the RRef's type look-up
    # (rref._get_type(blocking=False), a future). The first look-up is an rpc, whose
    # callback runs on an RPC thread outside the dist-autograd context: that iteration's
    # stage-1 forward would go unrecorded (no gradients at all). Done here once, the
    # future is cached complete, and the proxy then sends inline, in the caller's context.
    stage1._get_type(blocking=False).wait()
    stage1_async = stage1.rpc_async()   # stage1_async.forward(h): an rpc_async to worker 1
    xs, ys = x.chunk(chunks), y.chunk(chunks)
    note(f"rpc_gpipe chunks {chunks}: micro-batches of {[len(m) for m in ys]}; "
         f"{warmup} warm-up + {iters} timed iterations")

    def step():
        with dist_autograd.context() as ctx:
            # Sent as soon as stage 0 has it: worker 1 works on micro-batch m while
            # worker 0 computes m+1.
            futs = [stage1_async.forward(stage0(xm)) for xm in xs]
            loss = sum(torch.nn.functional.cross_entropy(f.wait(), ym) * (len(ym) / w5.BATCH)
                       for f, ym in zip(futs, ys))
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)
        return loss.item()

    return w5.timed(step, warmup, iters)


def run_pair(torch, rpc, quick):
    note(f"BLAS core {blas_core()} (OPENBLAS_CORETYPE="
         f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}), {torch.get_num_threads()} thread")
    warmup, iters = ITERS[quick]
    x, y = batch(torch)
    note("local floor: model_parallel_bench's local step, the whole model in worker 0")
    local_ms, local_losses = w5.bench_local(torch, x, y, warmup, iters)
    lines = [line(WORKLOAD, "local_ms_per_iter", summary("local", local_ms), "ms")]
    gpipe = {}
    for k in CHUNKS:
        ms, losses = bench_gpipe(torch, rpc, x, y, k, warmup, iters)
        check_losses(f"rpc_gpipe chunks {k}", losses, local_losses)
        gpipe[k] = summary(f"rpc_gpipe chunks {k}", ms)
        lines.append(line(WORKLOAD, f"rpc_gpipe_ms_per_iter_chunks{k}", gpipe[k], "ms"))
    with open(os.environ[RESULTS_ENV], "w") as f:
        json.dump({"local_losses": local_losses[:CHECKED_LOSSES], "rpc_gpipe": gpipe}, f)
    return lines


def worker(rank, quick):
    rpc_bench.run_worker(rank, DEADLINE_S[quick], lambda torch, rpc: run_pair(torch, rpc, quick))


# ---------------------------------------------------------------- Pipe process

def bench_torchpipe(torch, x, y, chunks, warmup, iters):
    from torch.distributed.pipeline.sync import Pipe
    model = w5.full_model()
    pipe = Pipe(torch.nn.Sequential(model[:w5.SPLIT], model[w5.SPLIT:]), chunks=chunks,
                checkpoint="never")
    opt = torch.optim.SGD(pipe.parameters(), lr=w5.LR)
    note(f"torchpipe chunks {chunks}: {len(pipe.partitions)} partitions on "
         f"{[str(d) for d in pipe.devices]}; {warmup} warm-up + {iters} timed iterations")

    def step():
        opt.zero_grad()
        out = pipe(x).local_value()
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return loss.item()

    return w5.timed(step, warmup, iters)


def run_pipe(torch, quick):
    with open(os.environ[RESULTS_ENV]) as f:
        pair = json.load(f)
    gpipe = {int(k): v for k, v in pair["rpc_gpipe"].items()}
    warmup, iters = ITERS[quick]
    x, y = batch(torch)
    lines, best = [], dict(gpipe)
    for k in CHUNKS:
        try:
            ms, losses = bench_torchpipe(torch, x, y, k, warmup, iters)
        except Exception as e:   # noqa: BLE001 - Pipe unusable here: say why, go on
            note(f"torchpipe chunks {k}: skipped, Pipe does not run on CPU in torch "
                 f"{torch.__version__}: {type(e).__name__}: {e}")
            continue
        check_losses(f"torchpipe chunks {k}", losses, pair["local_losses"])
        med = summary(f"torchpipe chunks {k}", ms)
        lines.append(line(WORKLOAD, f"torchpipe_ms_per_iter_chunks{k}", med, "ms"))
        best[k] = min(best[k], med)
    for k in CHUNKS:
        note(f"chunks {k}: best PyTorch pipeline "
             f"{'rpc_gpipe' if best[k] == gpipe[k] else 'torchpipe'}")
        lines.append(line(WORKLOAD, f"pipe_ms_per_iter_chunks{k}", best[k], "ms"))
    return lines


def pipe_worker(quick):
    rpc_bench.run_worker(0, PIPE_DEADLINE_S[quick], lambda torch, rpc: run_pipe(torch, quick),
                         world_size=1)


# ---------------------------------------------------------------- launcher side

def launch(quick):
    q = ["--quick"] if quick else []
    title = " ".join(["pipeline_bench"] + q)
    with tempfile.TemporaryDirectory(prefix="pipeline_bench.") as tmp:
        os.environ[RESULTS_ENV] = os.path.join(tmp, "pair.json")   # child_env() copies it
        status = rpc_bench.launch_pair(__file__, title, q, DEADLINE_S[quick])
        if status:
            return status
        print(f"{title}: torch.distributed.pipeline.sync.Pipe in one more process (RPC world "
              f"size 1)", file=sys.stderr, flush=True)
        why = rpc_bench.wait_pair(rpc_bench.start_pair(["--pipe"] + q, rpc_bench.child_env(),
                                                       script=__file__, world_size=1),
                                  PIPE_DEADLINE_S[quick])
    if why:
        print(f"{title}: Pipe process failed: {why}", file=sys.stderr)
        return 1
    return 0


def main():
    argv = sys.argv[1:]
    if "--pipe" in argv:   # the launcher's third process: --rank 0 --pipe [--quick]
        if [a for a in argv if a not in ("--pipe", "--quick")] != ["--rank", "0"]:
            usage(f"unexpected arguments: {' '.join(argv)}")
        pipe_worker("--quick" in argv)
        return 0
    return rpc_bench.quick_main(argv, launch, worker, usage)


if __name__ == "__main__":
    rpc_bench.run_main(main, "pipeline_bench")
