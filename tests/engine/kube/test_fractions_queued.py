"""Parts of a GPU queue like whole GPUs: with queueing on, the pool's flavors carry a time-slicing donor's
shares (made by ``gpu-offload queues sync``), two half-GPU cells are admitted on its one GPU, and a third waits
in Kueue until one of them ends, then runs; nothing is left behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import SAMPLED, KueueConfig
from .conftest import leftovers, queued_user_namespace, settings
from .helpers import Sink, run_cell

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "gpu-offload"
DONORS = (liqo.Donor("whole", 1, "A100", "2.00"),
          liqo.Donor("sliced", 1, "A100", "1.00", sharing="time-slicing", replicas=2))
HOLD = "import time\nwhile time.time() < until:\n    time.sleep(0.1)"


origin = KueueConfig(DONORS, SAMPLED).fixture()  # the session's Kueue origin of these options, DONORS peered


@pytest.fixture()
def kernel(origin: Any, api_client: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KubernetesBackend, str]]:
    core, custom = kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    name = queued_user_namespace(core, custom)
    backend = KubernetesBackend(settings(name, queue=QUEUE, priority="interactive"), api_client)
    yield backend, name
    backend.close()
    wait_until(lambda: not core.list_namespaced_pod(name).items, "no pod left", timeout=60)
    assert leftovers(core, name) == []
    wait_until(lambda: not custom.list_namespaced_custom_object(*KUEUE, name, "workloads")["items"],
               "no Workload left", timeout=60)
    core.delete_namespace(name)


def _admitted(custom: Any, namespace: str) -> list[bool]:
    return [any(c["type"] == "Admitted" and c["status"] == "True" for c in (w.get("status") or {}).get("conditions")
                or []) for w in custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"]]


def test_two_halves_are_admitted_on_one_shared_gpu_and_a_third_waits_in_kueue(
        kernel: tuple[KubernetesBackend, str], api_client: Any) -> None:
    backend, namespace = kernel
    core, custom = kubernetes.client.CoreV1Api(api_client), kubernetes.client.CustomObjectsApi(api_client)
    queue = custom.get_cluster_custom_object(*KUEUE, "clusterqueues", QUEUE)
    assert "nvidia.com/gpu.shared" in queue["spec"]["resourceGroups"][0]["coveredResources"]
    until = time.time() + 30.0
    results: dict[int, Any] = {}
    sinks = [Sink() for _ in range(3)]

    def go(index: int) -> None:
        try:
            results[index] = run_cell(backend, HOLD, {"until": until if index < 2 else 0.0}, sinks[index],
                                      fraction=0.5)[0]
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            results[index] = exc

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    wait_until(lambda: sum(_admitted(custom, namespace)) == 2, "both halves admitted", timeout=90)
    threads.append(threading.Thread(target=go, args=(2,), daemon=True))
    threads[-1].start()
    wait_until(lambda: len(_admitted(custom, namespace)) == 3, "the third half's Workload", timeout=60)
    time.sleep(2.0)  # Kueue had its chance to admit it: there is no share left
    assert sorted(_admitted(custom, namespace)) == [False, True, True]
    pods = [p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name]
    assert {p.spec.node_name for p in pods} == {"sliced-gpu"}
    assert [p.spec.containers[0].resources.limits for p in pods] == [{"nvidia.com/gpu.shared": "1"}] * 2
    for thread in threads:
        thread.join(180)
    for index in range(3):
        assert not isinstance(results[index], BaseException), results[index]
        assert results[index].status == "ok", (results[index].error, sinks[index].notices)
        # Kueue admitted it on the time-slicing donor: told once, and no donor here isolates part of a GPU
        warned = [n for n in sinks[index].notices if "0.5 of a GPU is not memory-isolated on cluster sliced" in n]
        assert len(warned) == 1 and warned[0].endswith("ask for a whole GPU (--gpus 1)."), sinks[index].notices
    assert any(n.startswith("admitted by Kueue after ") for n in sinks[2].notices), sinks[2].notices
