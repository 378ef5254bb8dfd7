"""Step time of data-parallel training with one slow rank: equal shards versus shares from ``gpo_shards``.

Two CPU ranks (gloo, local processes, one thread each) train a small MLP on a fixed global batch. Rank 1
stands for a slower GPU: after its own forward and backward it sleeps ``(slow - 1)`` times what they took,
so it is ``slow`` times slower without taking CPU from rank 0 (the machine has 2 cores). Each step then
all-reduces the gradients, as DDP does, and both ranks step their optimizer. A step's time is measured on
each rank from the start of its compute to the end of the optimizer step (so it includes the wait for the
other rank in the all-reduce); the table shows rank 0's.

Modes: ``equal`` gives each rank half the batch; ``proportional`` uses the shares ``shard_sizes`` gave once
from ``--calibrate`` equal steps timed with ``StepTimer`` (with ``loss_weight`` so the averaged gradient
stays the full batch's). After the calibration the two modes alternate step by step, so a change of the
machine's load (other sessions share its 2 cores) falls on both alike.

    .venv/bin/python bench/bench_shards.py [--steps 60] [--slow 3] [--batch 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

from harness import Run, Stopwatch  # bench/harness.py: the script's folder is on sys.path

BENCH = os.path.dirname(os.path.abspath(__file__))

RANK_SCRIPT = r"""
import json, sys, time
import torch
import torch.distributed as dist
from gpu_offload.engine.shards import StepTimer, loss_weight, shard_range, shard_sizes

steps, calibrate, slow, batch, warmup = (int(a) for a in sys.argv[1:6])
sys.path.insert(0, sys.argv[6])
from harness import Stopwatch  # the bench's clock, in each rank
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x, y = torch.randn(batch, 256), torch.randint(0, 10, (batch,))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
dist.barrier()


def step(sizes, timer=None):
    start, stop = shard_range(sizes, rank)
    watch = Stopwatch()
    loss = torch.nn.functional.cross_entropy(model(x[start:stop]), y[start:stop]) * loss_weight(sizes, rank)
    opt.zero_grad()
    loss.backward()
    work = watch.seconds
    if rank == 1 and slow > 1:
        time.sleep((slow - 1) * work)  # a GPU `slow` times slower, without taking CPU from the others
    if timer is not None:
        timer.add(watch.seconds, stop - start)
    for p in model.parameters():  # DDP's average of the ranks' gradients
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    return watch.seconds


equal = [batch // world + (1 if r < batch % world else 0) for r in range(world)]
out = {"equal": [], "proportional": []}
for _ in range(warmup):
    step(equal)
timer = StepTimer()
for _ in range(calibrate):
    step(equal, timer)
sizes = shard_sizes(batch, timer.seconds_per_item)
out["sizes"] = sizes
out["seconds_per_item"] = timer.seconds_per_item
# the modes alternate step by step: the machine's load changes by the second, and both modes share it
for _ in range(steps):
    out["equal"].append(step(equal))
    out["proportional"].append(step(sizes))
print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(steps: int, calibrate: int, slow: int, batch: int, warmup: int) -> list[dict]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", RANK_SCRIPT, *(str(a) for a in (steps, calibrate, slow, batch, warmup)), BENCH]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--calibrate", type=int, default=30)
    parser.add_argument("--slow", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    run = Run("shards", "Data-parallel step time with one slow rank: equal shards against gpo_shards' shares")
    run.note(f"2 CPU ranks (gloo), rank 1 slowed {args.slow}x, global batch {args.batch}, {args.steps} steps per "
             "mode, alternating")
    watch = Stopwatch()
    ranks = run_ranks(args.steps, args.calibrate, args.slow, args.batch, args.warmup)
    run.note(f"measured seconds per item: rank 0 {ranks[0]['seconds_per_item'] * 1e6:.1f} us, "
             f"rank 1 {ranks[1]['seconds_per_item'] * 1e6:.1f} us")
    half = [args.batch // 2, args.batch - args.batch // 2]
    for mode, sizes in (("equal", half), ("proportional", ranks[0]["sizes"])):
        run.figure(f"{mode} shards ({sizes[0]}, {sizes[1]}): rank 0 step", [t * 1000 for t in ranks[0][mode]], "ms")
    ratio = statistics.median(ranks[0]["equal"]) / statistics.median(ranks[0]["proportional"])
    # with compute only (no all-reduce, no optimizer step): equal waits for slow * B/2, proportional for
    # slow * B/(slow + 1) on both ranks
    run.figure("equal / proportional step time, medians", ratio, "x", lower_is_better=False)
    run.note(f"equal / proportional step time {ratio:.2f}x (compute alone would give {(args.slow + 1) / 2:.2f}x); "
             f"run took {watch.seconds:.0f} s")
    run.write()


if __name__ == "__main__":
    main()
