"""Distributed sessions on the kubernetes backend (sandbox): a trivial cell on 2 pods x 1 rank, one-shot (a new
Indexed Job per cell) against a warm distributed session (the same Job's pods, cells through one attachment
per pod), and the API requests each costs.

On an origin with two Liqo donors served in-process, through the official client and the real engine (the
ranks' events merged by ``RankedRun``, as the magic does). ``pass`` from submit until the engine has every
rank's ``done`` and the run is released (for one-shot: the Job deleted). Requests are counted at the sandbox
by catch-all fault rules with no effect (``bench_kube.CATEGORIES`` plus the Job and Service verbs).

Usage: .venv/bin/python bench/bench_rank_session.py [--cells 10]
"""

from __future__ import annotations

from bench_kube import CATEGORIES  # the script's folder is on sys.path
from harness import Run
from kube_cells import Category, measured_from_command_line, trivial_cell

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.ranked import RankedRun

TWO_NODES = Ranks(nodes=2, procs_per_node=1)
JOB_CATEGORIES: tuple[Category, ...] = (
    ("POST jobs", r"/namespaces/[^/]+/jobs$", ("POST",)),
    ("DELETE job", r"/namespaces/[^/]+/jobs/[^/]+$", ("DELETE",)),
    ("POST services", r"/namespaces/[^/]+/services$", ("POST",)),
    *CATEGORIES,
)


def one_cell(backend: KubernetesBackend, session: str | None = None) -> float:
    return trivial_cell(backend, RunRequest(gpus=1, ranks=TWO_NODES), session,
                        lambda run: RankedRun(run, TWO_NODES, settle=5.0 if session else None))


def main() -> None:
    got, cells = measured_from_command_line(__doc__, 10, JOB_CATEGORIES, one_cell)
    run = Run("rank_session", "Distributed sessions on the sandbox: one-shot Job against a warm session, 2 pods")
    run.note(f"cells per measure: {cells}")
    got.record(run, JOB_CATEGORIES, ("2-pod cell, one-shot Job", "2-pod cell, warm session"),
               "trivial cell (`pass`) on 2 pods x 1 rank, {}, submit to every rank done",
               ("one-shot Job (cold pods)", "warm distributed session"))
    run.write()

if __name__ == "__main__":
    main()
