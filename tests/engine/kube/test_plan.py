"""The kube backend's launch planner, decided from literal data alone (no cluster, no I/O): where a run goes
(placed or queued), the trust of its cluster and so the format its outputs come back in, whether its bundle
is stored, the objects to create, and every refusal with the words that say what to do instead."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from gpu_offload.liqo_peering.errors import NoFit
from gpu_offload.liqo_peering.inventory import Inventory, inventory_from_dict
from gpu_offload.liqo_peering.trust import TrustPolicy, trusting

from gpu_offload import images
from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.hub_api import MonthSpend
from gpu_offload.engine.backends.kube.budget import SpendReading
from gpu_offload.engine.backends.kube.config import KubeSettings, StorageSettings
from gpu_offload.engine.backends.kube.explain import placed_text
from gpu_offload.engine.backends.kube.follow import KUEUE_PICKS, admitted_context
from gpu_offload.engine.backends.kube.plan import (
    LaunchPlan,
    Offloading,
    PodOrder,
    Situation,
    inventory_need,
    plan_launch,
)
from gpu_offload.engine.errors import OffloadUsageError

# donor-a: 4 free A100s, trusted; donor-b: 6 of 8 L4s free, not trusted; donor-c: 1 free T4, not trusted
INVENTORY = inventory_from_dict({"clusters": [
    {"cluster_id": "donor-a", "name": "donor-a", "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": "liqo-donor-a", "cluster_id": "donor-a", "capacity": 4, "allocatable": 4, "in_use": 0,
         "model": "A100", "cpu_free": 8000}]},
    {"cluster_id": "donor-b", "name": "donor-b", "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": "liqo-donor-b", "cluster_id": "donor-b", "capacity": 8, "allocatable": 8, "in_use": 2,
         "model": "L4", "cpu_free": 2000}]},
    {"cluster_id": "donor-c", "name": "donor-c", "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": "liqo-donor-c", "cluster_id": "donor-c", "capacity": 1, "allocatable": 1, "in_use": 0,
         "model": "T4", "cpu_free": 16000}]},
]})
TRUST = trusting(["donor-a"])
MANIFEST = images.parse_manifest({
    "labels": {"python": "py", "cloudpickle": "cp", "torch": "torch"},
    "images": [
        {"role": "runner", "image": "gpuo/runner:1-py3.11", "recipe": "runner", "base": "python:3.11-slim",
         "debian": "", "python": "3.11", "cloudpickle": "3.1.1", "torch": ""},
        {"role": "runner", "image": "gpuo/runner:1-py3.12", "recipe": "runner", "base": "python:3.12-slim",
         "debian": "", "python": "3.12", "cloudpickle": "3.1.1", "torch": ""},
    ]})
KERNEL = images.Versions("3.11", "3.1.1", "")
CLUSTER_QUEUE = {"metadata": {"name": "pool"}, "spec": {"resourceGroups": [{"flavors": [
    {"name": "donor-a-a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]},
    {"name": "donor-b-l4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}}
SETTINGS = KubeSettings(namespace="alice", user="alice", kernel="k1", policy="most-free")
TOLERATION = [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}]
TWO_NODES = Ranks(nodes=2, procs_per_node=2)


def pinned_to(*clusters: str) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": list(clusters)},
                              {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]}}}


@dataclass(frozen=True)
class Case:
    """One row: a request in a situation, and the plan's facts (or the refusal) it must give."""

    request: RunRequest = field(default_factory=RunRequest)
    settings: dict[str, Any] = field(default_factory=dict)
    seen: dict[str, Any] = field(default_factory=dict)
    avoid: frozenset[str] = frozenset()
    bundle: bytes = b"bundle"
    expect: dict[str, Any] = field(default_factory=dict)
    """Facts of the plan (see :func:`facts`), or ``refused`` (a regex) and ``error`` (its type)."""


def inventory_of(inventory: Inventory, *cluster_ids: str) -> Inventory:
    """``inventory`` with only the named donors peered."""
    return dataclasses.replace(inventory, clusters=tuple(c for c in inventory.clusters if c.cluster_id in cluster_ids))


def plan(case: Case, trust: TrustPolicy = TRUST) -> LaunchPlan:
    seen = Situation(**{"queue": None, "kernel": KERNEL, "manifest": MANIFEST, "runner_size": 1000,
                        "kernel_pid": 42, "inventory": INVENTORY, **case.seen})
    order = PodOrder("r1", "nonce", case.request, case.bundle, bundle_run="r1")
    return plan_launch(order, case.avoid, dataclasses.replace(SETTINGS, **case.settings), trust, seen)


def facts(p: LaunchPlan) -> dict[str, Any]:
    """What a row may check of a plan, as plain data."""
    owner = p.owner("https://store/bundle", "ab" * 32) if p.stored else p.owner()
    container = (owner["spec"]["template"]["spec"] if p.kind == "Job" else owner["spec"])["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return {
        "kind": owner["kind"], "queue": p.queue, "clusters": p.clusters, "outputs_from": p.outputs_from,
        "trusted": p.trusted, "safe_outputs": env.get("GPU_OFFLOAD_OUTPUT_FORMAT") == "safe",
        "stored": p.stored, "bundle_url": env.get("GPU_OFFLOAD_BUNDLE_URL"), "offloading": p.offloading,
        "scheduling": dict(p.pod.scheduling), "ctx": (p.ctx.cluster, p.ctx.gpus, p.ctx.image, p.ctx.model),
        "waits_for": p.waits_for, "image": container["image"],
        "labels": {k: v for k, v in owner["metadata"]["labels"].items() if k.startswith("kueue.x-k8s.io/")},
        "owned": [o["kind"] for o in p.owned(owner, "uid-1", b"runner")],
        "deadline": owner["spec"].get("activeDeadlineSeconds"),
    }


PLACED = {
    # placement: the most free GPUs (donor-b), untrusted, so outputs come back in the safe format
    "one GPU goes where most are free": Case(expect={
        "kind": "Pod", "queue": None, "clusters": ("donor-b",), "outputs_from": "donor-b", "trusted": False,
        "safe_outputs": True, "stored": False, "offloading": Offloading(("donor-b",), ("donor-b",)),
        "scheduling": {"resources": {"limits": {"nvidia.com/gpu": "1"}}, "tolerations": TOLERATION,
                       "affinity": pinned_to("donor-b")},
        "ctx": ("donor-b", 1, "gpuo/runner:1-py3.11", "L4"), "waits_for": "", "owned": ["Secret"], "labels": {}}),
    "a model goes where that model is, trusted: pickles come back": Case(RunRequest(gpus=2, gpu_model="A100"), expect={
        "clusters": ("donor-a",), "trusted": True, "safe_outputs": False, "ctx": ("donor-a", 2, "gpuo/runner:1-py3.11",
                                                                                  "A100")}),
    "bin-pack takes the fullest node that fits": Case(settings={"policy": "bin-pack"}, expect={
        "clusters": ("donor-c",)}),
    "a retry avoids the first cluster": Case(avoid=frozenset({"donor-b"}), expect={"clusters": ("donor-a",)}),
    "a cluster offloaded already is not offloaded again": Case(seen={"offloaded": frozenset({"donor-b"})}, expect={
        "offloading": None}),
    "--timeout bounds the pod with a margin": Case(RunRequest(timeout=60.5, image="python:3.11-slim"), expect={
        "deadline": 91, "image": "python:3.11-slim"}),
    # storage: a bundle that with the runner passes the Secret's limit is stored, and the pod fetches it
    "a large bundle goes to object storage when there is one": Case(
        bundle=b"x" * (1 << 20), settings={"storage": StorageSettings("bucket")}, expect={
            "stored": True, "bundle_url": "https://store/bundle"}),
    "a small bundle travels on stdin": Case(settings={"storage": StorageSettings("bucket")}, expect={
        "stored": False, "bundle_url": None}),
    # distributed runs: one Job, all pods on one cluster unless --spread
    "a Job's pods all on one cluster": Case(RunRequest(gpus=2, ranks=TWO_NODES), expect={
        "kind": "Job", "clusters": ("donor-b",), "owned": ["Secret", "Service"], "ctx": (
            "donor-b", 2, "gpuo/runner:1-py3.11", "L4")}),
    "--spread: the clusters that together have room, outputs as the least trusted": Case(
        RunRequest(gpus=3, ranks=Ranks(nodes=3, procs_per_node=1, spread=True)), expect={
            "clusters": ("donor-b", "donor-a"), "outputs_from": "donor-b", "safe_outputs": True,
            "scheduling": {"resources": {"limits": {"nvidia.com/gpu": "3"}}, "tolerations": TOLERATION,
                           "affinity": pinned_to("donor-b", "donor-a")},
            "ctx": ("donor-b or donor-a", 3, "gpuo/runner:1-py3.11", None)}),
    "CPU ranks go to the node with the most CPU free": Case(RunRequest(gpus=0, ranks=TWO_NODES), expect={
        "kind": "Job", "clusters": ("donor-c",), "ctx": ("donor-c", 0, "gpuo/runner:1-py3.11", None)}),
}

QUEUED = {
    # queueing: no placement, Kueue picks the donor; affinity only where the cell narrows the donors
    "a queued pod names only its GPUs": Case(seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE},
                                             settings={"priority": "batch"}, expect={
        "queue": "gpus", "clusters": (KUEUE_PICKS,), "safe_outputs": True,
        "scheduling": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}, "offloading": Offloading((), ("*",)),
        "waits_for": "1 GPU", "labels": {"kueue.x-k8s.io/queue-name": "gpus",
                                         "kueue.x-k8s.io/priority-class": "batch"}}),
    "queued on an inventory of trusted donors only: pickles come back wherever Kueue admits it": Case(
        RunRequest(gpus=1), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE,
                                  "inventory": inventory_of(INVENTORY, "donor-a")}, expect={
            "clusters": (KUEUE_PICKS,), "trusted": True, "safe_outputs": False}),
    "queued without the inventory (no rights on nodes): the safe format, any donor may take it": Case(
        RunRequest(gpus=1), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE, "inventory": None}, expect={
            "clusters": (KUEUE_PICKS,), "trusted": False, "safe_outputs": True}),
    "queued --trusted-only: the trusted clusters": Case(
        RunRequest(gpus=2, trusted_only=True), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE}, expect={
            "clusters": ("donor-a",), "trusted": True, "safe_outputs": False, "waits_for": "2 GPUs",
            "offloading": Offloading(("donor-a",), ("donor-a",))}),
    "queued with a model: the clusters having it, by cluster id and model": Case(
        RunRequest(gpu_model="A100"), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE,
                                            "offloaded": frozenset({"donor-a"})}, expect={
            "clusters": ("donor-a",), "waits_for": "1 x A100", "offloading": None,
            "scheduling": {"resources": {"limits": {"nvidia.com/gpu": "1"}}, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-a"]},
                    {"key": "gpu-offload.io/gpu-model", "operator": "In", "values": ["A100"]}]}]}}}}}),
    "a queued Job carries the queue's labels, not its pods, and waits in line as one": Case(
        RunRequest(gpus=1, ranks=TWO_NODES), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE}, expect={
            "kind": "Job", "labels": {"kueue.x-k8s.io/queue-name": "gpus"}, "waits_for": "2 pods of 1 GPU"}),
}

REFUSED = {
    "no GPUs for a cell": (Case(RunRequest(gpus=0)), r"^--gpus 0: the kubernetes backend runs cells on donated GPUs"),
    "a runner image of another Python": (Case(RunRequest(image="gpuo/runner:1-py3.12")), r"Python 3\.12"),
    "no runner image for this Python": (Case(seen={"kernel": images.Versions("3.9")}),
                                        r"^Nothing was launched: there is no runner image for Python 3\.9"),
    "a move with queueing on": (Case(seen={"queue": "gpus"}, avoid=frozenset({"donor-b"})),
                                r"^queueing through Kueue is on \(LocalQueue gpus\), so this kernel does not move"),
    "a move of a pinned cell": (Case(RunRequest(cluster="donor-b"), avoid=frozenset({"donor-b"})),
                                r"^the cell asked for --cluster donor-b \(drop it to let placement choose\)"),
    "a budget without the hub": (Case(settings={"budget": 10.0}, seen={"spend": SpendReading(no_hub=True)}),
                                 r"GPU_OFFLOAD_MONTHLY_BUDGET is set but GPU_OFFLOAD_SERVICE_URL is not"),
    "a budget that cannot be checked": (Case(settings={"budget": 10.0}, seen={"spend": SpendReading(problem="503")}),
                                        r"^Your monthly GPU budget \(10\) could not be checked: 503"),
    "a budget spent": (Case(settings={"budget": 10.0}, seen={"spend": SpendReading(MonthSpend(
        "2026-11", 3, 5.0, 12.5, 0, 10.0))}), r"^Your monthly GPU budget is spent: your runs in 2026-11 \(UTC\) cost 12\.50"),
    "CPU ranks with queueing on": (Case(RunRequest(gpus=0, ranks=TWO_NODES), seen={"queue": "gpus"}),
                                   r"^--gpus 0 with --nodes: queueing through Kueue is on \(LocalQueue gpus\)"),
    "--spread of CPU ranks": (Case(RunRequest(gpus=0, ranks=dataclasses.replace(TWO_NODES, spread=True))),
                              r"^--spread with --gpus 0: CPU ranks go to the one virtual node"),
    "--spread with queueing on": (Case(RunRequest(ranks=dataclasses.replace(TWO_NODES, spread=True)),
                                       seen={"queue": "gpus"}),
                                  r"^Nothing was launched: --spread: queueing is on \(LocalQueue gpus\).*Leave out "
                                  r"--spread"),
    "more GPUs than any flavor's quota": (Case(RunRequest(gpus=9), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE}),
                                          r"asks for 9 GPUs and no flavor of ClusterQueue pool holds that many \(the "
                                          r"largest, donor-b-l4, has a quota of 8\).*--gpus 8 or fewer"),
    "queued --trusted-only on an untrusted pin": (Case(RunRequest(cluster="donor-b", trusted_only=True),
                                                       seen={"queue": "gpus"}),
                                                  r"only trusted clusters were asked for and cluster donor-b is not "
                                                  r"trusted"),
    "queued with a model no donor has": (Case(RunRequest(gpu_model="H100"), seen={"queue": "gpus"}),
                                         r"^Nothing was launched: no donor has GPU model H100"),
    "an unknown placement policy": (Case(settings={"policy": "random"}),
                                    r"placement policy 'random' is unknown; use one of most-free"),
    "--trusted-only where only untrusted clusters have room": (Case(RunRequest(gpus=6, trusted_only=True)),
                                                               r"^Nothing was launched: .*without --trusted-only"),
    "GPU_OFFLOAD_MEMORY that is not a quantity": (Case(seen={"memory": "lots"}),
                                                  r"GPU_OFFLOAD_MEMORY='lots' is not a Kubernetes memory quantity"),
    "a large bundle without object storage": (Case(bundle=b"x" * (1 << 20)),
                                              r"no object storage is configured\. Nothing was launched\. Set "
                                              r"GPU_OFFLOAD_S3_BUCKET"),
}


@pytest.mark.parametrize("case", [*PLACED.values(), *QUEUED.values()], ids=[*PLACED, *QUEUED])
def test_the_plan_of_each_launch(case: Case) -> None:
    got = facts(plan(case))
    assert {k: got[k] for k in case.expect} == case.expect


@pytest.mark.parametrize(("case", "refused"), REFUSED.values(), ids=list(REFUSED))
def test_each_refusal_is_made_with_what_to_do(case: Case, refused: str) -> None:
    with pytest.raises(OffloadUsageError, match=refused):
        plan(case)


def test_no_room_is_the_placements_own_error_naming_spread_for_a_job() -> None:
    # the backend words NoFit (a PlacementError) as "Nothing was launched: ..." with what is free
    with pytest.raises(NoFit, match="no cluster has 7 free"):
        plan(Case(RunRequest(gpus=7)))
    with pytest.raises(NoFit, match=r"The 2 pods of this run ask for 4 GPUs each, all on one cluster; add --spread"):
        plan(Case(RunRequest(gpus=4, ranks=TWO_NODES)))


def test_the_budget_is_not_checked_again_for_a_move_and_not_at_all_without_one() -> None:
    spent = SpendReading(MonthSpend("2026-11", 3, 5.0, 12.5, 0, 10.0))
    moved = plan(Case(settings={"budget": 10.0}, seen={"spend": spent}, avoid=frozenset({"donor-b"})))
    assert moved.clusters == ("donor-a",)  # the cell already runs: its pod may move whatever it costs
    assert plan(Case(seen={"spend": spent})).clusters == ("donor-b",)


def test_the_inventory_is_read_only_where_the_plan_uses_it() -> None:
    assert inventory_need(RunRequest(), None) == "required"  # placing
    assert inventory_need(RunRequest(gpu_model="A100"), "gpus") == "required"  # a queued run narrowed to a model
    # Kueue places it, but among the donors whose nvidia.com/gpu counts whole GPUs (queued_whole); a kernel that
    # cannot read the inventory leaves it to Kueue unnarrowed
    assert inventory_need(RunRequest(), "gpus") == "narrow"
    assert inventory_need(RunRequest(gpus=0, ranks=TWO_NODES), "gpus") == "none"  # CPU ranks: Kueue alone
    assert plan(Case(seen={"queue": "gpus", "inventory": None})).clusters == (KUEUE_PICKS,)


def test_the_untrusted_runner_is_told_so_whatever_the_cell_sets() -> None:
    # the format travels in the pod's environment; a cell's --env cannot ask an untrusted donor for pickles
    request = RunRequest(env={"GPU_OFFLOAD_OUTPUT_FORMAT": "pickle", "MY_VAR": "1"})
    assert facts(plan(Case(request)))["safe_outputs"] is True
    trusted = plan(Case(dataclasses.replace(request, gpu_model="A100")))
    assert trusted.pod.env == {"GPU_OFFLOAD_OUTPUT_FORMAT": "pickle", "MY_VAR": "1"}


SHARED = inventory_from_dict({"clusters": [
    {"cluster_id": "donor-a", "name": "donor-a", "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": "liqo-donor-a", "cluster_id": "donor-a", "capacity": 4, "allocatable": 4, "in_use": 0,
         "model": "A100", "memory": "80Gi", "devices": [["nvidia.com/gpu", 4, 0]]}]},
    {"cluster_id": "donor-s", "name": "donor-s", "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": "liqo-donor-s", "cluster_id": "donor-s", "capacity": 0, "allocatable": 0, "in_use": 0,
         "model": "A100", "memory": "80Gi", "sharing": "mps", "replicas": 4,
         "devices": [["nvidia.com/gpu.shared", 8, 2]]}]},
]})


def test_part_of_a_gpu_asks_the_sharing_donor_in_its_units_and_tells_the_runner() -> None:
    placed = plan(Case(RunRequest(fraction=0.25), seen={"inventory": SHARED}))
    assert placed.clusters == ("donor-s",)
    assert placed.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert placed.pod.env["GPU_OFFLOAD_GPU_ISOLATION"] == "compute and memory"
    assert placed.pod.env["GPU_OFFLOAD_GPU_MEMORY_LIMIT"] == str(20 * 2**30)
    assert placed.ctx.share.startswith("0.25 of a GPU (mps: 1 nvidia.com/gpu.shared")
    # an MPS donor lends one share per pod (NVIDIA's plugin refuses two), so half a GPU is refused with the fix
    with pytest.raises(NoFit, match=r"donor-s: this donor shares each GPU by MPS as 4 parts of 20 GiB; one pod gets "
                                    r"one part; ask for --gpus 1/4 or less"):
        plan(Case(RunRequest(fraction=0.5), seen={"inventory": SHARED}))
    queued = plan(Case(RunRequest(gpu_memory=10 * 2**30), seen={"inventory": SHARED, "queue": "gpu-offload",
                                                                "cluster_queue": CLUSTER_QUEUE}))
    assert queued.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert queued.clusters == ("donor-s",) and queued.offloading == Offloading(("donor-s",), ("donor-s",))
    # Kueue may admit it on any donor lending a quarter as one share: the runner is told the part, whose bytes
    # are those of the GPU it lands on, not the cheapest donor's
    assert queued.pod.env["GPU_OFFLOAD_GPU_FRACTION"] == "0.25" and "GPU_OFFLOAD_GPU_MEMORY_LIMIT" not in queued.pod.env
    assert inventory_need(RunRequest(fraction=0.5), "gpu-offload") == "required"
    with pytest.raises(NoFit, match="donor-a: this donor lends whole GPUs only"):
        plan(Case(RunRequest(fraction=0.5, cluster="donor-a"), seen={"inventory": SHARED}))


# donor-m lends MPS shares and donor-t time-sliced shares under the same resource name: a queued quarter asks
# for one share that Kueue may admit on either, and only MPS isolates the cell's memory
MIXED = inventory_from_dict({"clusters": [
    {"cluster_id": c, "name": c, "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": f"liqo-{c}", "cluster_id": c, "capacity": 0, "allocatable": 0, "in_use": 0,
         "model": "A100", "memory": "80Gi", "sharing": mode, "replicas": 4,
         "devices": [["nvidia.com/gpu.shared", 8, 0]]}]}
    for c, mode in (("donor-m", "mps"), ("donor-t", "time-slicing"))]})


def _admitted_on(cluster: str) -> dict[str, Any]:
    return {"metadata": {"name": "run-r1"}, "spec": {"nodeName": f"liqo-{cluster}",
                                                     "nodeSelector": {"liqo.io/remote-cluster-id": cluster}}}


def test_a_queued_fraction_says_once_admitted_whether_its_donor_isolates_its_memory() -> None:
    queued = plan(Case(RunRequest(fraction=0.25), seen={"inventory": MIXED, "queue": "gpu-offload",
                                                          "cluster_queue": CLUSTER_QUEUE}))
    assert queued.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert queued.ctx.cluster == KUEUE_PICKS and queued.ctx.notice == ""  # not known before Kueue picks
    sliced = placed_text(_admitted_on("donor-t"), admitted_context(_admitted_on("donor-t"), queued.ctx))
    assert "(Liqo cluster donor-t, 0.25 of a GPU (time-slicing: 1 nvidia.com/gpu.shared; isolation: none)" in sliced
    assert ("0.25 of a GPU is not memory-isolated on cluster donor-t (time-slicing): another pod on the same GPU "
            "can take the memory") in sliced
    assert sliced.endswith("run it on a donor that isolates GPU memory (--cluster donor-m) or ask for a whole GPU "
                           "(--gpus 1).")
    mps = placed_text(_admitted_on("donor-m"), admitted_context(_admitted_on("donor-m"), queued.ctx))
    assert "0.25 of a GPU (mps: 1 nvidia.com/gpu.shared; isolation: compute and memory)" in mps
    assert "not memory-isolated" not in mps


def test_a_queued_pod_pinned_to_a_cluster_says_the_model_of_the_flavor_kueue_admitted_it_on() -> None:
    queued = plan(Case(RunRequest(cluster="donor-a"), seen={"queue": "gpus", "cluster_queue": CLUSTER_QUEUE}))
    assert (queued.ctx.cluster, queued.ctx.model) == ("donor-a", None)  # the plan does not know the model
    admitted = {"metadata": {"name": "run-r1"}, "spec": {"nodeName": "liqo-donor-a", "nodeSelector": {
        "liqo.io/remote-cluster-id": "donor-a", "gpu-offload.io/gpu-model": "A100"}}}
    assert placed_text(admitted, admitted_context(admitted, queued.ctx)) == (
        "running in pod run-r1 on virtual node liqo-donor-a (Liqo cluster donor-a, 1 x A100)")
    # a selector naming another cluster than the pinned one is not the pod's: nothing is taken from it
    elsewhere = {"spec": {"nodeSelector": {"liqo.io/remote-cluster-id": "donor-b", "gpu-offload.io/gpu-model": "T4"}}}
    assert admitted_context(elsewhere, queued.ctx) == queued.ctx


def test_a_placed_fraction_without_memory_isolation_is_told_so_with_the_fix() -> None:
    placed = plan(Case(RunRequest(fraction=0.25, cluster="donor-t"), seen={"inventory": MIXED}))
    assert placed.ctx.cluster == "donor-t"
    assert placed.ctx.notice.endswith("(--cluster donor-m) or ask for a whole GPU (--gpus 1).")
    # under --trusted-only the fix names no untrusted donor: only a whole GPU is left
    alone = plan(Case(RunRequest(fraction=0.25, cluster="donor-t", trusted_only=True), seen={"inventory": MIXED}),
                 trust=trusting(["donor-t"]))
    assert alone.ctx.notice.endswith("no donor you can use lends part of a GPU with memory isolation, so ask for "
                                     "a whole GPU (--gpus 1).")
    # half a GPU is two of donor-m's MPS shares, which it does not lend to one pod: the fix does not name it
    half = plan(Case(RunRequest(fraction=0.5, cluster="donor-t"), seen={"inventory": MIXED}))
    assert half.ctx.notice.endswith("no donor you can use lends part of a GPU with memory isolation, so ask for "
                                    "a whole GPU (--gpus 1).")
    isolated = plan(Case(RunRequest(fraction=0.25, cluster="donor-m"), seen={"inventory": MIXED}))
    assert isolated.ctx.notice == "" and "isolation: compute and memory" in isolated.ctx.share


def test_a_queued_part_of_a_gpu_is_not_refused_by_a_pool_without_whole_gpus() -> None:
    # every donor shares its GPUs: the ClusterQueue's nvidia.com/gpu quotas are 0, its shares' are not
    shares_only = {"metadata": {"name": "pool"}, "spec": {"resourceGroups": [{"flavors": [
        {"name": f"{c}-a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 0},
                                            {"name": "nvidia.com/gpu.shared", "nominalQuota": 8}]}
        for c in ("donor-m", "donor-t")]}]}}
    queued = plan(Case(RunRequest(fraction=0.25), seen={"inventory": MIXED, "queue": "gpu-offload",
                                                          "cluster_queue": shares_only}))
    assert queued.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    with pytest.raises(OffloadUsageError, match="asks for 1 GPUs and no flavor of ClusterQueue pool holds"):
        plan(Case(RunRequest(), seen={"inventory": MIXED, "queue": "gpu-offload", "cluster_queue": shares_only}))


def test_a_whole_gpu_with_every_whole_gpu_taken_runs_alone_on_a_memory_isolators_gpu() -> None:
    pool = inventory_from_dict({"clusters": [
        {"cluster_id": "donor-a", "name": "donor-a", "role": "Provider", "health": "healthy", "virtual_nodes": [
            {"name": "liqo-donor-a", "cluster_id": "donor-a", "capacity": 4, "allocatable": 4, "in_use": 4,
             "model": "A100", "memory": "80Gi", "devices": [["nvidia.com/gpu", 4, 4]]}]},
        {"cluster_id": "donor-h", "name": "donor-h", "role": "Provider", "health": "healthy", "virtual_nodes": [
            {"name": "liqo-donor-h", "cluster_id": "donor-h", "capacity": 0, "allocatable": 0, "in_use": 0,
             "model": "A100", "memory": "80Gi", "sharing": "memory",
             "devices": [["nvidia.com/gpu", 20, 0], ["nvidia.com/gpumem", 2 * 80 * 1024, 0]]}]}]})
    placed = plan(Case(RunRequest(), seen={"inventory": pool}))
    assert placed.clusters == ("donor-h",)
    assert placed.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "81920"}}
    assert placed.pod.env["GPU_OFFLOAD_GPU_SHARING"] == "memory"
    assert "GPU_OFFLOAD_GPU_MEMORY_LIMIT" not in placed.pod.env and "GPU_OFFLOAD_GPU_FRACTION" not in placed.pod.env
    with pytest.raises(NoFit, match="no cluster has 2 free GPUs"):  # an isolator lends one whole GPU per pod
        plan(Case(RunRequest(gpus=2), seen={"inventory": pool}))


def test_a_session_pod_gets_the_hubs_notice_as_its_grace_period_and_a_one_shot_pod_does_not() -> None:
    seen = Situation(queue=None, kernel=KERNEL, manifest=MANIFEST, runner_size=1000, kernel_pid=42,
                     inventory=INVENTORY)
    hub = dataclasses.replace(SETTINGS, session_notice=180)  # the chart's offload.sessionNotice
    session = plan_launch(PodOrder("s1", "nonce", RunRequest(), session=True), frozenset(), hub, TRUST, seen)
    assert session.owner()["spec"]["terminationGracePeriodSeconds"] == 180
    one_shot = plan_launch(PodOrder("r1", "nonce", RunRequest(), b"bundle", bundle_run="r1"), frozenset(), hub,
                           TRUST, seen)
    assert one_shot.owner()["spec"]["terminationGracePeriodSeconds"] == 10
    unset = plan_launch(PodOrder("s2", "nonce", RunRequest(), session=True), frozenset(), SETTINGS, TRUST, seen)
    assert unset.owner()["spec"]["terminationGracePeriodSeconds"] == 60


# donor-h lends its GPUs through a memory isolator (nvidia.com/gpu counts 10 slots a GPU) and is the cheapest;
# donor-t time-slices under the plain name (nvidia.com/gpu counts 4 shares a GPU); donor-a lends whole GPUs
ISOLATOR = {"cluster_id": "donor-h", "name": "donor-h", "role": "Provider", "health": "healthy", "virtual_nodes": [
    {"name": "liqo-donor-h", "cluster_id": "donor-h", "capacity": 0, "allocatable": 0, "in_use": 0,
     "model": "A100", "memory": "80Gi", "sharing": "memory", "price": 0.5,
     "devices": [["nvidia.com/gpu", 20, 0], ["nvidia.com/gpumem", 2 * 80 * 1024, 0]]}]}
PLAIN_SLICED = {"cluster_id": "donor-t", "name": "donor-t", "role": "Provider", "health": "healthy", "virtual_nodes": [
    {"name": "liqo-donor-t", "cluster_id": "donor-t", "capacity": 0, "allocatable": 0, "in_use": 0,
     "model": "A100", "memory": "80Gi", "sharing": "time-slicing", "replicas": 4,
     "devices": [["nvidia.com/gpu", 8, 0]]}]}
WHOLE = {"cluster_id": "donor-a", "name": "donor-a", "role": "Provider", "health": "healthy", "virtual_nodes": [
    {"name": "liqo-donor-a", "cluster_id": "donor-a", "capacity": 4, "allocatable": 4, "in_use": 4,
     "model": "A100", "memory": "80Gi", "price": 2.0, "devices": [["nvidia.com/gpu", 4, 4]]}]}
QUEUED = {"queue": "gpu-offload", "cluster_queue": CLUSTER_QUEUE}


def test_a_queued_whole_gpu_is_kept_off_donors_whose_gpu_resource_counts_slots_or_shares() -> None:
    # Kueue's flavor of donor-h or donor-t counts nvidia.com/gpu as slots or shares: a plain ask admitted there
    # would hold one slot without the GPU's memory, or one time-slice; every GPU of donor-a is busy right now
    pool = inventory_from_dict({"clusters": [ISOLATOR, PLAIN_SLICED, WHOLE]})
    queued = plan(Case(RunRequest(), seen={"inventory": pool, **QUEUED}))
    assert queued.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert queued.pod.scheduling["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-a"]}]}]}
    assert queued.clusters == ("donor-a",) and "GPU_OFFLOAD_GPU_SHARING" not in queued.pod.env
    # a pool of whole-GPU donors only: no narrowing, Kueue picks among all of them as before
    plain = plan(Case(RunRequest(), seen={"inventory": INVENTORY, **QUEUED}))
    assert "affinity" not in plain.pod.scheduling and plain.clusters == (KUEUE_PICKS,)


def test_a_queued_whole_gpu_where_no_donor_lends_whole_gpus_asks_an_isolator_for_a_slot_and_all_its_memory() -> None:
    pool = inventory_from_dict({"clusters": [ISOLATOR, PLAIN_SLICED]})
    queued = plan(Case(RunRequest(), seen={"inventory": pool, **QUEUED}))
    assert queued.pod.scheduling["resources"] == {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "81920"}}
    assert queued.clusters == ("donor-h",)
    assert queued.pod.env["GPU_OFFLOAD_GPU_SHARING"] == "memory"
    assert "GPU_OFFLOAD_GPU_MEMORY_LIMIT" not in queued.pod.env and "GPU_OFFLOAD_GPU_FRACTION" not in queued.pod.env
    assert queued.ctx.share == ("a whole GPU (memory: 1 nvidia.com/gpu, 81920 nvidia.com/gpumem; isolation: "
                                "compute and memory)")
    with pytest.raises(OffloadUsageError, match=r"no donor lends 2 whole GPUs to a queued run: donor-h: its "
                       r"nvidia.com/gpu counts memory slots, not whole GPUs; donor-t: .* time-slicing shares.*; "
                       r"ask for --gpus 1 \(a memory isolator lends one whole GPU per pod\)"):
        plan(Case(RunRequest(gpus=2), seen={"inventory": pool, **QUEUED}))
    with pytest.raises(OffloadUsageError, match="no donor lends 1 whole GPU to a queued run: donor-t: .*; ask for "
                       "part of a GPU"):
        plan(Case(RunRequest(), seen={"inventory": inventory_from_dict({"clusters": [PLAIN_SLICED]}), **QUEUED}))
