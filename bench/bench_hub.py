"""The admin clusters page with 100 peered clusters and 2,000 offloaded pods (goal: rendered in <= 300 ms).

A sandbox API server (127.0.0.1) is seeded with 100 Liqo donors (ForeignCluster, ResourceSlice,
VirtualNode, virtual Node each) and 2,000 runner pods bound to their virtual nodes. The service's
``HubState`` then fills itself through real list+watch over HTTP, exactly as in a deployment, and the
page is rendered from that watch-fed state the way the clusters handler does it:
- warm: nothing changed since the last render (the inventory snapshot is reused);
- after a change: one pod was patched through the API and its watch event applied, so the inventory is
  rebuilt from 100 ForeignClusters, 100 VirtualNodes, 100 Nodes and 2,000 pods before rendering.
The HTTP round trip through JupyterHub's proxy and OAuth is not included. Prints a Markdown table with the
machine and the date. Run: ``.venv/bin/python bench/bench_hub.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time

import kubernetes
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service import pages
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.sandbox.liqo import controllers as liqo_controllers
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.server import ApiServer
from harness import (  # bench/harness.py: the script's folder is on sys.path
    LIQO_CRDS,
    Run,
    Stopwatch,
    percentile,
    sandbox,
    timed,
)

CLUSTERS, PODS, GOAL_MS = 100, 2000, 300.0
PREFIX = "/services/gpu-offload/"


def seed(server: ApiServer) -> None:
    """100 donors of 8 GPUs each, and 2,000 one-GPU runner pods spread over their virtual nodes."""
    api = server.api
    liqo_controllers.ensure_crds(api)
    donors = liqo.donors(CLUSTERS, gpus=32)
    liqo_controllers.seed(api, donors)
    api.create(api.type("", "v1", "namespaces"), {"metadata": {"name": "jhub-users"}})
    pods = api.type("", "v1", "pods")
    for i in range(PODS):
        donor = donors[i % CLUSTERS]
        api.create(pods, {"metadata": {"name": f"gpuo-run-{i}", "labels": {
            "gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": f"user-{i % 50}"}},
            "spec": {"nodeName": donor.node_name, "restartPolicy": "Never", "containers": [{
                "name": "runner", "image": "python:3.11", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}},
            "jhub-users")


def render(state: HubState) -> str:
    """What ``ClustersPage.get`` produces (minus the XSRF token, which costs nothing measurable)."""
    body = pages.clusters_page(state.cluster_rows(), PREFIX, True, "<input type=hidden name=_xsrf>")
    return pages.layout("Peered clusters", body, PREFIX, "admin")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, sandbox(crds=LIQO_CRDS, plugins=[seed]) as sb:
        api_client = sb.api_client()
        state = HubState(HubConfig(), api_client, Store(f"sqlite:///{tmp}/usage.sqlite"))
        started = Stopwatch()
        state.start()
        if not state.wait_synced(300):
            print("the watches did not sync within 300 s", file=sys.stderr)
            return 1
        synced_ms = started.ms
        html = render(state)
        assert html.count("<tr>") == CLUSTERS + 1, "every cluster must be on the page"
        core = kubernetes.client.CoreV1Api(api_client)
        tick = [0]

        def change_one_pod() -> None:
            # a pod changes (as runs start and end all the time); wait until the watch delivered it
            tick[0] += 1
            version = state.cache.stats()["Pod"]["resource_version"]
            core.patch_namespaced_pod("gpuo-run-0", "jhub-users", {"metadata": {"annotations": {"t": str(tick[0])}}})
            while state.cache.stats()["Pod"]["resource_version"] == version:
                time.sleep(0.005)

        rows = [("warm (no change since last render)", *timed(lambda: render(state), 50)),
                ("after one pod changed (inventory rebuilt)", *timed(lambda: render(state), 20, change_one_pod))]
        state.close()
        api_client.close()
    run = Run("hub", "Hub admin clusters page")
    run.note(f"state: {CLUSTERS} clusters, {PODS} offloaded pods; first list+watch sync {synced_ms:.0f} ms; "
             f"page {len(html) // 1024} KiB; goal: render <= {GOAL_MS:g} ms")
    worst = 0.0
    for name, wall, cpu in rows:
        worst = max(worst, percentile(wall, 0.95))
        run.figure(f"clusters page render, {name}, wall", wall, "ms")
        run.figure(f"clusters page render, {name}, CPU", cpu, "ms")
    run.goal("worst render wall p95", worst, GOAL_MS)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
