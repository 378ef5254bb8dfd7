"""The kubernetes backend on the sandbox: API requests per offloaded cell, and a trivial cell's overhead.

Three measures, on an origin with two Liqo donors served in-process, through the official client:

- ``requests per cell``: HTTP requests the sandbox served per one-shot cell (and per session cell) once the
  inventory cache is warm and the namespace is offloaded, counted at the sandbox by catch-all fault rules
  that add no error and a negligible delay (``api.faults``), broken down by verb and resource;
- ``trivial cell, one-shot``: ``pass`` from submit until the engine has the ``done`` frame and the pod is
  deleted (a new pod each time: Secret, scheduling, process start, log follow);
- ``trivial cell, warm session``: the same in a session pod (command through attach, frames through the
  session's log follow).

Usage: .venv/bin/python bench/bench_kube.py [--cells 20]
"""

from __future__ import annotations

from harness import Run  # bench/harness.py: the script's folder is on sys.path
from kube_cells import Category, measured_from_command_line, trivial_cell

from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend

# Counted in this order (the first matching rule counts a request); the last one catches the rest.
CATEGORIES: tuple[Category, ...] = (
    ("POST pods", r"/namespaces/[^/]+/pods$", ("POST",)),
    ("GET pods (watch one pod)", r"/namespaces/[^/]+/pods$", ("GET",)),
    ("GET pods/log (follow)", r"/pods/[^/]+/log$", ("GET",)),
    ("GET pods/attach", r"/pods/[^/]+/attach$", ()),
    ("GET pod", r"/namespaces/[^/]+/pods/[^/]+$", ("GET",)),
    ("DELETE pod", r"/namespaces/[^/]+/pods/[^/]+$", ("DELETE",)),
    ("POST secrets", r"/namespaces/[^/]+/secrets$", ("POST",)),
    ("other", r"^/(api|apis)/", ()),
)


def one_cell(backend: KubernetesBackend, session: str | None = None) -> float:
    return trivial_cell(backend, RunRequest(gpus=1), session)


def main() -> None:
    got, cells = measured_from_command_line(__doc__, 20, CATEGORIES, one_cell)
    run = Run("kube", "Kubernetes backend on the sandbox")
    run.note(f"cells per measure: {cells}; goal: <= 8 API requests per one-shot cell")
    got.record(run, CATEGORIES, ("one-shot cell", "warm-session cell"), "trivial cell (`pass`), {}, submit to done",
               ("one-shot pod (cold)", "warm session pod"))
    run.write()

if __name__ == "__main__":
    main()
