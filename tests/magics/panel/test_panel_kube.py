"""The panel with the kubernetes backend on an emulated origin with two Liqo donors: the donors appear as
rows with model, free/total GPUs, price and health; choosing one sends the next cell there; the run is listed
with its cluster, output and end state."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.magics.dashboard.sources import KernelFeeds
from gpu_offload.magics.dashboard.widget import Panel, PanelActions
from gpu_offload.sandbox.fixtures import core, namespace, wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.runs.listing import record_of
from gpu_offload.engine.runs.tracking import tracker

from ...origins import PEERED

origin = PEERED.fixture()  # shared with the kube backend's tests (tests/origins.py)
__all__ = ["core", "namespace", "origin"]


@pytest.fixture()
def shell(origin: Any, namespace: str) -> Iterator[Any]:
    """A real IPython shell whose magic runs cells on the sandbox's donors."""
    from gpu_offload.magics.magic import GpuOffloadMagics
    from IPython.core.interactiveshell import InteractiveShell

    api = origin.sandbox.api_client()
    backend = KubernetesBackend(KubeSettings(namespace=namespace, user="alice@example.org",
                                             kernel=f"k-{uuid.uuid4().hex[:8]}", watch_seconds=5), api)
    ipython = InteractiveShell.instance()
    ipython.reset()
    magics = GpuOffloadMagics(ipython, backends={"kubernetes": backend})
    magics.backend = "kubernetes"
    ipython.register_magics(magics)
    yield ipython, magics
    magics.close()
    api.close()


def _html(box: Any) -> str:
    return " ".join(getattr(w, "value", "") or _html(w) for w in getattr(box, "children", ()))


def test_donors_are_rows_and_choosing_one_sends_the_next_cell_there(shell: Any, namespace: str) -> None:
    ipython, magics = shell
    feeds = KernelFeeds(magics, {**os.environ, "GPU_OFFLOAD_NAMESPACE": namespace}, tracker())
    panel = Panel(feeds.clusters, feeds.runs, PanelActions(feeds.choose, feeds.chosen, feeds.cancel),
                  wait_change=feeds.wait_change, interval=0.5, on_close=feeds.close)
    try:
        wait_until(lambda: "donor-2" in _html(panel.cluster_box), "the donors listed", timeout=60)
        rows = {row.key: row for row in feeds.clusters()[0]}
        assert rows["local"].backend == "local"
        donor = next(r for r in rows.values() if r.name.startswith("donor-2") or r.key.startswith("donor-2"))
        assert (donor.model, donor.free, donor.total, donor.price, donor.health) == ("L4", 8, 8, 0.8, "healthy")
        assert "No cluster is configured" not in panel.notes.value

        panel.click_choose(donor.key)
        assert (magics.backend, magics.default_cluster) == ("kubernetes", donor.key)
        ipython.run_cell_magic("gpu_offload", "", "print('on the chosen donor')\nanswer = 42")
        assert ipython.user_ns["answer"] == 42
        run = next(r for r in tracker().records() if "on the chosen donor" in r.tail)
        assert (run.cluster, run.backend, run.state) == (donor.key, "kubernetes", "done")
        wait_until(lambda: run.run_id[:12] in _html(panel.run_box) and "done" in _html(panel.run_box),
                   "the run shown done", timeout=30)

        # with --cluster auto the row names the cluster placement chose, not "auto"
        ipython.run_cell_magic("gpu_offload", "--cluster auto --gpu-model A100", "print('placed by the backend')")
        placed = next(r for r in tracker().records() if "placed by the backend" in r.tail)
        assert placed.cluster == next(k for k, r in rows.items() if r.model == "A100")
    finally:
        panel.close()
    assert not panel.thread.is_alive()


def test_a_runner_pod_without_a_live_kernel_is_listed_and_cancel_deletes_it(shell: Any, namespace: str) -> None:
    ipython, magics = shell
    ipython.run_cell_magic("gpu_offload", "--session warm", "kept = 1")
    feeds = KernelFeeds(magics, {**os.environ, "GPU_OFFLOAD_NAMESPACE": namespace}, tracker())
    assert feeds.user_runs is not None
    from_pods = [record_of(r) for r in feeds.user_runs.user_runs()]
    (pod_run,) = [r for r in from_pods if r.state == "running"]
    assert pod_run.backend == "kubernetes" and pod_run.gpus == 1 and pod_run.pid == 0
    assert pod_run.cluster.startswith("donor-") and pod_run.kernel == magics._backends["kubernetes"].settings.kernel

    said = feeds.cancel(pod_run)  # a record from the pod alone: no kernel to ask, so its pod goes
    assert "deleted" in said, said
    wait_until(lambda: not [r for r in feeds.user_runs.user_runs() if r.run_id == pod_run.run_id],
               "the orphaned runner pod deleted", timeout=60)


def test_a_panel_opened_before_any_cell_reads_through_the_kernels_own_backend(
        origin: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No second cluster connection: the panel starts the kernel's kubernetes backend (as the next cell would)
    and reads the donors and the user's runs through it; the backend runs the next cell with the same."""
    from gpu_offload.magics.magic import GpuOffloadMagics

    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.setenv("GPU_OFFLOAD_NAMESPACE", namespace)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice@example.org")
    monkeypatch.delenv("GPU_OFFLOAD_SERVICE_URL", raising=False)
    magics = GpuOffloadMagics(None)
    try:
        assert magics.started_backends() == []
        feeds = KernelFeeds(magics, dict(os.environ), tracker())
        (backend,) = magics.started_backends()
        assert backend.name == "kubernetes"
        assert feeds.user_runs is backend.user_runs() and feeds._cache is backend.inventory()
        wait_until(lambda: any(r.key.startswith("donor-") for r in feeds.clusters()[0]), "the donors listed",
                   timeout=60)
        assert feeds.runs().problems == ()
    finally:
        magics.close()
