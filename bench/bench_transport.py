"""Numpy round trip through the runner's shm buffer transport, against ``a.copy()`` in the same run.

A round trip is what an offloaded cell ``b = a`` costs for one array that goes in and comes back: the
engine dumps it (one copy into /dev/shm), the runner loads it (a mapping, no copy), the runner dumps the
result, the engine loads it (a mapping). "one-shot": the runner hands the unchanged input back without a
copy; "copy-back": a session runner (or a cell that makes a new array) copies it into a new file. Wall
times are milliseconds. Goal (issue 2): at 64 MiB and above, at most 2x ``a.copy()``.

    python bench/bench_transport.py            # 1 MiB .. 256 MiB
    python bench/bench_transport.py --full     # up to 1 GiB (needs ~4 GiB free memory)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np
from harness import Run, timed  # bench/harness.py: the script's folder is on sys.path

from gpu_offload.runner import buffers, handover


def round_trip(array: np.ndarray, shm_dir: str, one_shot: bool) -> tuple[np.ndarray, np.ndarray]:
    """In and out once, as the engine and a runner do for ``b = a``; returns the result and the runner's
    array (freed by the caller, untimed). A one-shot runner maps its inputs shared and hands an
    unchanged input back without a copy (src/gpu_offload/runner/handover.py); a session runner copies."""
    sent = buffers.dump({"a": array}, "shm", shm_dir=shm_dir)  # engine: inputs
    remote = buffers.load(sent.pickle, sent.buffers, share=one_shot)["a"]  # runner: load inputs
    back = buffers.dump({"b": remote}, "shm", shm_dir=shm_dir)  # runner: outputs
    handover.release()  # runner: end of the run
    buffers.discard(sent.buffers)  # engine: its input references, before loading the outputs
    return buffers.load(back.pickle, back.buffers)["b"], remote  # engine: load outputs


def measure(run: Run, mib: int, repeats: int, shm_dir: str) -> None:
    """Wall and CPU of a.copy(), dump, load and the full round trip for a ``mib`` MiB array (what each returns
    is freed untimed, as real use frees it later, when the variable is dropped)."""
    array = np.random.default_rng(0).random(mib * 2**20 // 8)
    for one_shot in (True, False):
        check, _ = round_trip(array, shm_dir, one_shot)
        assert np.array_equal(check, array), "round trip changed the data"
        del check, _
    copy, copy_cpu = timed(array.copy, repeats)
    dumped: list[buffers.Dumped] = []
    dump, _ = timed(lambda: dumped.append(buffers.dump({"a": array}, "shm", shm_dir=shm_dir)), repeats)
    load, _ = timed(lambda: buffers.load(dumped[-1].pickle, dumped.pop().buffers), repeats)
    once, once_cpu = timed(lambda: round_trip(array, shm_dir, True), repeats)
    twice, twice_cpu = timed(lambda: round_trip(array, shm_dir, False), repeats)
    for name, wall in (("a.copy()", copy), ("dump", dump), ("load", load), ("trip one-shot", once),
                       ("trip copy-back", twice)):
        run.figure(f"{mib} MiB: {name}", wall, "ms")
    for name, cpu in (("a.copy()", copy_cpu), ("trip one-shot", once_cpu), ("trip copy-back", twice_cpu)):
        run.figure(f"{mib} MiB: {name} CPU", cpu, "ms")
    median = statistics.median
    run.figure(f"{mib} MiB: one-shot / copy, wall medians", median(once) / median(copy), "x")
    run.figure(f"{mib} MiB: copy-back / copy, wall medians", median(twice) / median(copy), "x")
    if mib >= 64:
        run.goal(f"{mib} MiB: one-shot / copy", median(once) / median(copy), 2.0, "x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="go up to 1 GiB (default stops at 256 MiB)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [1, 4, 16, 64, 256] + ([1024] if args.full else [])
    shm_dir = buffers.default_shm_dir()
    run = Run("transport", "Numpy round trip through the runner's shm buffer transport, against a.copy()")
    run.note(f"shm dir: {shm_dir}; {args.repeats} runs per size (3 at 1 GiB); trips include the engine's discard "
             "and the runner's release")
    for mib in sizes:
        measure(run, mib, args.repeats if mib < 1024 else 3, shm_dir)
    leftovers = (
        [n for n in os.listdir(shm_dir) if n.startswith("gpuo-")] if shm_dir != tempfile.gettempdir() else []
    )
    if leftovers:
        run.note(f"warning: {len(leftovers)} gpuo- files left in {shm_dir} (other processes may own them)")
    run.write()


if __name__ == "__main__":
    main()
