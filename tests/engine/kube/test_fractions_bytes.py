"""A queued half of a GPU is held to half of the GPU Kueue admitted it on, not to half of the cheapest donor's.
Two MPS donors lend halves as the same resource (one share of two), one of a 40 GiB GPU and one of an 80 GiB
GPU. The pod is written before Kueue picks; the cheaper donor's GPU is held, so Kueue admits the half on the
80 GiB one. The runner is told the part (0.5 of a GPU) and takes its bytes from the GPU it runs on (here a GPU
the cell plugs into the runner's sources, as NVML or torch reads a real one): a cell holding 30 GiB is within
its 40 GiB and runs to the end; before, it was told the cheaper donor's 20 GiB and was stopped."""

from __future__ import annotations

import threading
import time
from typing import Any

import kubernetes
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import SAMPLED, KueueConfig
from ...runner.fake_gpu import prelude
from .helpers import Sink, run_cell
from .test_fractions_queued import _admitted, kernel  # noqa: F401 (the fixture, by name)

DONORS = (liqo.Donor("mps40", 1, "A100", "1.00", sharing="mps", replicas=2, gpu_memory_gib=40),
          liqo.Donor("mps80", 1, "A100", "1.50", sharing="mps", replicas=2, gpu_memory_gib=80))
CELL = prelude(80) + ("import os, time\ngpu_alloc(30)\ntime.sleep(3)\n"
                      "seen = (os.environ.get('GPU_OFFLOAD_GPU_MEMORY_LIMIT'), "
                      "os.environ.get('GPU_OFFLOAD_GPU_FRACTION'))\n")


origin = KueueConfig(DONORS, SAMPLED).fixture()  # the session's Kueue origin of these options, DONORS peered


def test_a_queued_half_is_held_to_half_of_the_gpu_it_was_admitted_on(
        kernel: tuple[KubernetesBackend, str], api_client: Any) -> None:  # noqa: F811 (the fixture)
    backend, namespace = kernel
    custom = kubernetes.client.CustomObjectsApi(api_client)
    until = time.time() + 20.0
    held: dict[str, Any] = {}

    def hold(name: str) -> None:  # one of the 40 GiB GPU's two MPS shares (an MPS donor lends one per pod)
        held[name] = run_cell(backend, "import time\nwhile time.time() < until:\n    time.sleep(0.1)",
                              {"until": until}, gpu_memory=20 * 2**30, cluster="mps40")[0]

    holders = [threading.Thread(target=hold, args=(name,), daemon=True) for name in ("a", "b")]
    for holder in holders:
        holder.start()
    # both shares of the 40 GiB GPU held, so Kueue has only the 80 GiB donor left
    wait_until(lambda: sum(_admitted(custom, namespace)) == 2, "the 40 GiB GPU held", timeout=120)
    sink = Sink()
    outcome, _, run = run_cell(backend, CELL, ns := {}, sink, fraction=0.5)
    for holder in holders:
        holder.join(120)
    assert [held[n].status for n in ("a", "b")] == ["ok", "ok"], [held[n].error for n in ("a", "b")]
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert run.current.ctx.cluster == "mps80"
    assert ns["seen"] == (None, "0.5")  # the part, whose bytes are the admitted GPU's
