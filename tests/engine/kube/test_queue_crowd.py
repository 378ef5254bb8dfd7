"""The scenario of issue 15: 24 kernels each offload a one-GPU cell at once to a pool of 16 GPUs. Without
queueing 8 of them failed (Unschedulable); with Kueue every one waits its turn and runs.

24 kernels are 24 ``KubernetesBackend`` objects (each with its own client, queue watch and pods) driven by
the real engine in 24 threads of this process, not 24 Jupyter kernel processes, which this 2-core machine
could not run beside the sandbox. Three users, eight kernels each, in their own namespaces and LocalQueues.
"""

from __future__ import annotations

import threading
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from ...origins import QUEUED
from .conftest import leftovers, queued_user_namespace, settings
from .helpers import run_cell

USERS = ("alice@example.org", "bob@example.org", "carol@example.org")
KERNELS_PER_USER = 8
CELL = "import time\ntime.sleep(2)\nprint('done on', __import__('os').environ.get('HOSTNAME', 'a GPU'))"


origin = QUEUED.with_donors((liqo.Donor("donor-1", 8, "A100", "2.00"), liqo.Donor("donor-2", 8, "L4", "0.80"))
                            ).fixture()  # the session's Kueue origin of default options, these donors peered


def test_24_one_gpu_cells_against_16_gpus_all_run_and_none_fails(origin: Any, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    admin = origin.sandbox.api_client()
    core, custom = kubernetes.client.CoreV1Api(admin), kubernetes.client.CustomObjectsApi(admin)
    namespaces = []
    for _ in USERS:
        namespaces.append(queued_user_namespace(core, custom))
    clients = [origin.sandbox.api_client() for _ in range(len(USERS) * KERNELS_PER_USER)]
    kernels = [KubernetesBackend(settings(namespaces[i % len(USERS)], user=USERS[i % len(USERS)],
                                          queue="gpu-offload", priority="interactive"), client)
               for i, client in enumerate(clients)]
    results: dict[int, Any] = {}
    start = threading.Barrier(len(kernels))

    def cell(index: int) -> None:
        start.wait()  # all at once, as 24 users pressing shift-enter together
        try:
            results[index] = run_cell(kernels[index], CELL, {})
        except BaseException as exc:  # noqa: BLE001 - asserted below
            results[index] = exc

    threads = [threading.Thread(target=cell, args=(i,), daemon=True) for i in range(len(kernels))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(900)
        failed = {i: r if isinstance(r, BaseException) else (r[0].status, r[0].error, r[1].notices)
                  for i, r in results.items() if isinstance(r, BaseException) or r[0].status != "ok"}
        assert len(results) == len(kernels) and not failed, failed
        assert all("done on" in r[1].text for r in results.values())
    finally:
        for kernel in kernels:
            kernel.close()
        for client in clients:
            client.close()
    for ns, user in zip(namespaces, USERS, strict=True):
        wait_until(lambda ns=ns, user=user: not leftovers(core, ns, user), "no pod or Secret left", timeout=120)
        wait_until(lambda ns=ns: not custom.list_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"], "no Workload left", timeout=120)
    admin.close()
