"""The runner's cap and watch on a real GPU (docs/sharing.md): what this machine's tests cannot run.

A runner told it holds a quarter of a GPU (``GPU_OFFLOAD_GPU_FRACTION=0.25``, as the origin tells a queued share)
installs its cap (``runner/gpu_cap.py``) before the cell imports torch; then, in that process, the cell allocates a
fifth of the GPU (within its part) and a further tenth (past it). Recorded: whether torch's per-process fraction
refused the allocation past the part (the goal: refused), and what the watch (``runner/gpu_watch.py``) reads of the
process while it holds the fifth: PyTorch's ``memory_reserved`` and NVML's per-process figure (found only where
the process shares the host's process ids, as here), against the bytes allocated. Under MPS (a container the
device plugin gave ``CUDA_MPS_PIPE_DIRECTORY``), the runner's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is in force too
and the record says so. Each check runs in a process of its own: the cap's hook waits for the first import of
torch. On a machine without a GPU nothing is measured: the run says so.

Run: ``.venv/bin/python bench/bench_gpu_cap.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness import REPO, Run

PART = 0.25
CHILD = f"""
import json
from gpu_offload.runner import gpu_cap, gpu_watch
assert gpu_cap.install()
import torch
found = {{"gpu": torch.cuda.is_available(), "mps": gpu_cap.MPS_LIMIT in __import__("os").environ}}
if found["gpu"]:
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.empty(int(total * {PART} * 0.8), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    mine, nvml = gpu_watch._torch_reading(), gpu_watch._nvml_reading()
    found.update(total=total, allocated=held.numel(), torch=mine.used if mine else None,
                 nvml=nvml.used if nvml else None)
    try:
        more = torch.empty(int(total * {PART} * 0.4), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        found["past_the_part"] = "allocated"
    except torch.cuda.OutOfMemoryError:
        found["past_the_part"] = "refused"
print(json.dumps(found))
"""


def child() -> dict[str, object]:
    env = {**os.environ, "GPU_OFFLOAD_GPU_FRACTION": str(PART)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=env,
                          cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"the capped process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    run = Run("gpu_cap", f"The runner's cap and watch on a real GPU, holding {PART} of it")
    found = child()
    if not found["gpu"]:
        run.note("no GPU on this machine: the cap, torch's and NVML's readings are not measured here "
                 "(tests/runner/test_gpu_cap.py and test_gpu_watch.py test the runner's code with a GPU played "
                 "by the test)")
        run.write()
        return 0
    mib = 2**20
    total, allocated = int(found["total"]), int(found["allocated"])  # type: ignore[call-overload]
    run.note(f"GPU memory {total / mib:.0f} MiB; held {allocated / mib:.0f} MiB, then asked {PART * 0.4:g} of the "
             f"GPU more (past the part); MPS limit set: {found['mps']}")
    for source in ("torch", "nvml"):
        if found[source] is None:
            run.note(f"{source}: no reading of this process")
        else:
            run.figure(f"{source} reading / allocated", int(found[source]) / allocated, "x")  # type: ignore[call-overload]
    refused = found["past_the_part"] == "refused"
    run.note(f"allocation past the part: {found['past_the_part']}")
    run.goal("allocations past the part that torch let through", 0.0 if refused else 1.0, 0.0, "")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
