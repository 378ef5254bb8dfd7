"""What users are offered: free GPUs per model over usable nodes only, and the spawner profiles built on it."""

from __future__ import annotations

from typing import Any

from gpu_offload.hub_extension.service.views import ModelSupply, supply_by_model, user_inventory
from gpu_offload.hub_extension.spawner.hooks import gpu_profiles
from gpu_offload.liqo_peering.inventory import build_inventory


def _fc(cid: str, healthy: bool = True) -> dict[str, Any]:
    ok = {"enabled": True, "conditions": [{"type": "X", "status": "Ready" if healthy else "Error"}]}
    return {"metadata": {"name": cid}, "spec": {"clusterID": cid},
            "status": {"role": "Provider", "modules": {"offloading": ok, "authentication": ok, "networking": ok}}}


def _node(name: str, cid: str, gpus: int, model: str | None, price: str | None = None, cordoned: bool = False
          ) -> dict[str, Any]:
    labels = {"liqo.io/type": "virtual-node", "liqo.io/remote-cluster-id": cid}
    labels.update({k: v for k, v in (("gpu-offload.io/gpu-model", model), ("gpu-offload.io/price-per-gpu-hour", price),
                                     ("gpu-offload.io/cordoned", "true" if cordoned else None)) if v})
    return {"metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(node: str, gpus: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{node}", "namespace": "u"}, "status": {"phase": "Running"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


INVENTORY = build_inventory(
    [_fc("a"), _fc("b"), _fc("c", healthy=False)],
    nodes=[_node("a-1", "a", 8, "A100", "3"), _node("b-1", "b", 4, "A100", "2.5"), _node("b-2", "b", 4, "L4", None, True),
           _node("c-1", "c", 8, "H100", "9"), _node("a-2", "a", 2, None)],
    pods=[_pod("a-1", 6)],
)


def test_supply_counts_only_what_a_new_run_could_get() -> None:
    assert supply_by_model(INVENTORY) == [
        ModelSupply("A100", 6, ("a", "b"), 2.5),  # 2 left on a-1, 4 on b-1
        ModelSupply("unlabelled", 2, ("a",), None),
    ]  # L4 is cordoned, H100's cluster is down
    body = user_inventory(INVENTORY)
    assert body["free_gpus_by_model"] == {"A100": 6, "unlabelled": 2}
    assert body["price_per_gpu_hour_by_model"] == {"A100": 2.5}


def test_profiles_offer_each_labelled_model_with_free_gpus() -> None:
    profiles = gpu_profiles(INVENTORY)
    assert [p["slug"] for p in profiles] == ["standard", "liqo-gpu-a100"]
    assert profiles[1]["description"].startswith("6 free on 2 clusters, from 2.5 per GPU-hour")
    assert profiles[1]["kubespawner_override"] == {"environment": {"GPU_OFFLOAD_GPU_MODEL": "A100"}}


def test_the_queues_page_says_what_to_do_when_there_is_nothing_to_show() -> None:
    from datetime import datetime, timezone

    from gpu_offload.hub_extension.service.pages import HubContext, queues_page
    from gpu_offload.hub_extension.service.queue_page import queues_view
    from gpu_offload.liqo_peering.kueue import QueueSettings

    now, ctx = datetime.now(timezone.utc), HubContext("/services/gpu-offload/", "admin", True, "x")
    off = queues_page(ctx, queues_view(None, [], [], [], [], str, now))
    assert "Queueing is off" in off and "queueing.kueue.enabled: true" in off
    missing = queues_view(QueueSettings(), [], [], [], [], str, now, "ClusterQueues (cluster-wide): <HTTP 403>")
    page = queues_page(ctx, missing)
    assert missing.enabled and not missing.exists
    assert "No ClusterQueue gpu-offload yet" in page and "queues-sync" in page and "gpu-offload queues sync" in page
    assert "&lt;HTTP 403&gt;" in page  # the watch's error, escaped
    empty = queues_view(QueueSettings(), [{"metadata": {"name": "gpu-offload"}, "spec": {}}], [], [], [], str, now)
    assert "no donor grants GPUs" in queues_page(ctx, empty) and "Nothing waits or runs" in queues_page(ctx, empty)


def test_the_queues_page_shows_kueue_s_texts_on_one_bounded_line() -> None:
    # Kueue's messages and descriptions, a flavor's annotations and an owner's name are whatever was written in
    # the objects: escapes, a newline and 10 kB must reach neither the page nor the admins' JSON API.
    from datetime import datetime, timezone

    from gpu_offload.hub_extension.service.pages import HubContext, queues_page
    from gpu_offload.hub_extension.service.queue_page import queues_view
    from gpu_offload.hub_extension.service.views import to_json
    from gpu_offload.liqo_peering.kueue import QueueSettings
    from gpu_offload.liqo_peering.untrusted_text import MAX_SHOWN

    hostile = "\x1b[31mPreempted\x1b[0m\r\n<b>forged</b>\x07 line" + "z" * 10_000
    settings = QueueSettings()
    now, ctx = datetime.now(timezone.utc), HubContext("/services/gpu-offload/", "admin", True, "x")
    queue = {"metadata": {"name": settings.cluster_queue}, "spec": {"resourceGroups": [{"flavors": [
        {"name": "donor-1-a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}]}]}]}}
    flavor = {"metadata": {"name": "donor-1-a100", "annotations": {"liqo.io/remote-cluster-id": hostile,
                                                                      "gpu-offload.io/gpu-model": hostile}}}
    classes = [{"metadata": {"name": c.name}, "value": c.value, "description": hostile} for c in settings.priority_classes]
    workload = {"metadata": {"name": "pod-runner-1", "namespace": "u-alice", "creationTimestamp": "2026-11-28T12:00:00Z",
                             "ownerReferences": [{"kind": "Pod", "name": hostile}]},
                "spec": {"queueName": settings.local_queue, "podSets": []},
                "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "message": hostile}]}}
    view = queues_view(settings, [queue], [flavor], classes, [workload], str, now, "Workloads (cluster-wide): " + hostile)
    texts = [view.workloads[0].message, view.workloads[0].owner, view.flavors[0].cluster_id, view.flavors[0].model,
             view.watch_error] + [c.description for c in view.priority_classes]
    assert view.priority_classes and view.workloads[0].message.startswith("[31mPreempted [0m <b>forged</b> linezzz")
    for text in texts:
        assert not any(c in text for c in "\x1b\r\n\x07") and len(text) <= 600 + len("...") and text.endswith("...")
    assert max(len(t) for t in texts if t is not view.watch_error) == MAX_SHOWN + len("...")
    page = queues_page(ctx, view)
    assert "\x1b" not in page and "\x07" not in page and "zzz..." in page and "z" * 601 not in page
    assert "&lt;b&gt;forged&lt;/b&gt;" in page and "<b>forged" not in page  # still escaped as HTML
    api = str(to_json(view))
    assert "\\x1b" not in api and "z" * 601 not in api
