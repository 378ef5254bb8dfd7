"""A queued part of a GPU runs as the donor Kueue admitted it on: the pod is made before Kueue picks between a
time-slicing and an MPS donor lending the same shares, and the runner and the placement notice both name the
donor it landed on (MPS, memory isolated), not the cheaper one the pod was written for. And a whole GPU in a
pool where no donor lends whole GPUs runs alone on a memory isolator's GPU."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import SAMPLED, KueueConfig
from .conftest import leftovers, settings
from .helpers import Sink, run_cell
from .test_fractions_queued import _admitted, kernel  # noqa: F401 (the fixture, by name)

DONORS = (liqo.Donor("sliced", 1, "A100", "1.00", sharing="time-slicing", replicas=2),
          liqo.Donor("mps", 1, "A100", "1.50", sharing="mps", replicas=2),
          liqo.Donor("hami", 1, "A100", "3.00", sharing="memory"))
SEEN = ("import os\nseen = (os.environ.get('GPU_OFFLOAD_GPU_SHARING'), os.environ.get('GPU_OFFLOAD_GPU_ISOLATION'), "
        "os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'))")


origin = KueueConfig(DONORS, SAMPLED).fixture()  # the session's Kueue origin of these options, DONORS peered


def test_a_half_admitted_on_the_mps_donor_runs_and_is_told_as_mps(
        kernel: tuple[KubernetesBackend, str], api_client: Any) -> None:  # noqa: F811 (the fixture)
    import kubernetes

    backend, namespace = kernel
    custom = kubernetes.client.CustomObjectsApi(api_client)
    until = time.time() + 20.0
    held: dict[str, Any] = {}

    def hold() -> None:  # the whole time-sliced GPU (both shares), so Kueue has only the MPS donor left
        held["outcome"] = run_cell(backend, "import time\nwhile time.time() < until:\n    time.sleep(0.1)",
                                   {"until": until}, gpu_memory=80 * 2**30, cluster="sliced")[0]

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    wait_until(lambda: sum(_admitted(custom, namespace)) == 1, "the time-sliced GPU held", timeout=90)
    sink = Sink()
    outcome, _, run = run_cell(backend, SEEN, ns := {}, sink, fraction=0.5)
    holder.join(120)
    assert held["outcome"].status == "ok", held["outcome"].error
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert run.current.ctx.cluster == "mps"
    # the pod was written for the cheaper time-slicing donor; the runner took the mode of the donor it runs on
    assert ns["seen"][:2] == ("mps", "compute and memory")
    assert any("0.5 of a GPU (mps: 1 nvidia.com/gpu.shared; isolation: compute and memory)" in n
               for n in sink.notices), sink.notices
    assert not any("not memory-isolated" in n for n in sink.notices), sink.notices


def test_a_whole_gpu_runs_alone_on_a_memory_isolators_gpu_when_no_donor_lends_whole_gpus(
        origin: Any, api_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubernetes

    core, custom = kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    namespace = f"jhub-{uuid.uuid4().hex[:8]}"  # no LocalQueue in it: placement picks the node
    core.create_namespace({"metadata": {"name": namespace, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings", {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}})
    placed = KubernetesBackend(settings(namespace), api_client)
    limits: list[Any] = []

    def seen_pod() -> bool:
        pods = core.list_namespaced_pod(namespace).items
        limits.extend(p.spec.containers[0].resources.limits for p in pods)
        return bool(pods)

    cell = ("import os, time\nwhile time.time() < until:\n    time.sleep(0.1)\n"
            "seen = (os.environ.get('CUDA_DEVICE_MEMORY_LIMIT_0'), os.environ.get('GPU_OFFLOAD_GPU_SHARING'), "
            "os.environ.get('GPU_OFFLOAD_GPU_MEMORY_LIMIT'))")
    result: dict[str, Any] = {}
    ns: dict[str, Any] = {"until": time.time() + 5.0}
    sink = Sink()

    def go() -> None:
        try:
            result["out"] = run_cell(placed, cell, ns, sink)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            result["out"] = exc

    runner = threading.Thread(target=go, daemon=True)
    try:
        runner.start()
        wait_until(seen_pod, "the whole GPU's pod", timeout=60)
        runner.join(120)
    finally:
        placed.close()
    assert not isinstance(result["out"], BaseException), result["out"]
    outcome, _, run = result["out"]
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert run.current.ctx.cluster == "hami"
    assert limits[0] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(80 * 1024)}, sink.notices
    # the isolator's device plugin limits the container to the whole GPU's memory; the runner caps nothing
    assert ns["seen"] == (f"{80 * 1024}m", "memory", None)
    assert any("a whole GPU (memory: 1 nvidia.com/gpu, 81920 nvidia.com/gpumem; isolation: compute and memory)"
               in n for n in sink.notices), sink.notices
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "no pod left", timeout=60)
    assert leftovers(core, namespace) == []
    core.delete_namespace(namespace)
