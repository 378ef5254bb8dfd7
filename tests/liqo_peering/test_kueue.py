"""The Kueue objects that describe the pool: built from the inventory, valid against Kueue's own CRDs."""

from __future__ import annotations

import pytest
from gpu_offload.liqo_peering import kueue as K
from gpu_offload.liqo_peering.inventory import build_inventory
from gpu_offload.liqo_peering.trust import ClusterPolicy, TrustPolicy, apply_policy

from .conftest import foreign_cluster, node, pod


def _inventory(policy: TrustPolicy | None = None, **nodes_by_name):
    nodes = list(nodes_by_name.values())
    clusters = sorted({n["metadata"]["labels"]["liqo.io/remote-cluster-id"] for n in nodes})
    inventory = build_inventory([foreign_cluster(c) for c in clusters], [], nodes, [pod("p", "a-gpu", 1)])
    return apply_policy(inventory, policy or TrustPolicy())


def _pool(policy: TrustPolicy | None = None, **changes):
    base = {
        "a-gpu": node("a-gpu", "donor-a", 4, "A100", **{"gpu-offload.io/price-per-gpu-hour": "2.5"}),
        "b-gpu": node("b-gpu", "donor-b", 8, "L4", **{"gpu-offload.io/price-per-gpu-hour": "0.8"}),
    }
    return _inventory(policy, **{**base, **changes})


def test_one_flavor_per_donor_and_model_selects_its_virtual_node_and_tolerates_liqos_taint(kueue_schema) -> None:
    wanted = K.desired(_pool(), TrustPolicy(), K.QueueSettings())
    flavors = {f["metadata"]["name"]: f for f in wanted.flavors}
    assert flavors["gpuo-donor-a-a100"]["spec"] == {
        "nodeLabels": {"liqo.io/remote-cluster-id": "donor-a", "gpu-offload.io/gpu-model": "A100"},
        "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}],
    }
    assert set(flavors) == {"gpuo-donor-a-a100", "gpuo-donor-b-l4"}
    for flavor in wanted.flavors:
        kueue_schema(flavor)
        assert flavor["metadata"]["labels"] == {"gpu-offload.io/managed-by": "gpu-offload"}


def test_the_cluster_queue_quota_is_what_each_donor_granted_cheapest_flavor_first(kueue_schema) -> None:
    queue = K.desired(_pool(), TrustPolicy(), K.QueueSettings(cluster_queue="pool")).cluster_queue
    kueue_schema(queue)
    assert queue["metadata"]["name"] == "pool"
    spec = queue["spec"]
    assert (spec["queueingStrategy"], spec["preemption"], spec["admissionScope"]) == (
        "BestEffortFIFO", {"withinClusterQueue": "LowerPriority"}, {"admissionMode": "UsageBasedAdmissionFairSharing"})
    assert spec["namespaceSelector"] == {"matchLabels": {"gpu-offload.io/user-namespace": "true"}}
    (group,) = spec["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu"]
    # the node factory grants 16 CPUs and 64Gi; L4 at 0.8 comes before A100 at 2.5; pods in use do not matter
    assert group["flavors"] == [
        {"name": "gpuo-donor-b-l4", "resources": [{"name": "cpu", "nominalQuota": "16"},
                                                  {"name": "memory", "nominalQuota": "64Gi"},
                                                  {"name": "nvidia.com/gpu", "nominalQuota": "8"}]},
        {"name": "gpuo-donor-a-a100", "resources": [{"name": "cpu", "nominalQuota": "16"},
                                                    {"name": "memory", "nominalQuota": "64Gi"},
                                                    {"name": "nvidia.com/gpu", "nominalQuota": "4"}]},
    ]


def _gpu_quota(queue) -> dict[str, str]:
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}["nvidia.com/gpu"]
            for g in queue["spec"]["resourceGroups"] for f in g["flavors"]}


@pytest.mark.parametrize("lost", [
    node("a-gpu", "donor-a", 4, "A100", unschedulable=True),
    node("a-gpu", "donor-a", 4, "A100", annotations={"gpu-offload.io/cordoned": "true"}),
    node("a-gpu", "donor-a", 4, "A100", ready=False),
])
def test_a_cordoned_or_lost_donor_keeps_its_flavor_with_zero_quota(lost, kueue_schema) -> None:
    queue = K.desired(_pool(**{"a-gpu": lost}), TrustPolicy(), K.QueueSettings()).cluster_queue
    kueue_schema(queue)
    assert _gpu_quota(queue) == {"gpuo-donor-b-l4": "8", "gpuo-donor-a-a100": "0"}
    cpu = {f["name"]: f["resources"][0]["nominalQuota"] for f in queue["spec"]["resourceGroups"][0]["flavors"]}
    assert cpu["gpuo-donor-a-a100"] == "0"


def test_a_donor_whose_peering_is_down_grants_nothing() -> None:
    nodes = [node("a-gpu", "donor-a", 4, "A100")]
    inventory = build_inventory([foreign_cluster("donor-a", offloading="NotReady")], [], nodes, [])
    assert _gpu_quota(K.desired(inventory, TrustPolicy(), K.QueueSettings()).cluster_queue) == {"gpuo-donor-a-a100": "0"}


def test_the_admins_model_and_price_win_and_then_the_flavor_selects_on_the_cluster_alone(kueue_schema) -> None:
    policy = TrustPolicy({"donor-a": ClusterPolicy(gpu_model="H100", price_per_gpu_hour=0.1)})
    wanted = K.desired(_pool(policy), policy, K.QueueSettings())
    first = wanted.flavors[0]
    assert first["metadata"]["name"] == "gpuo-donor-a-h100"  # now the cheapest
    # the node's own label says A100: selecting on the admin's model would match no node
    assert first["spec"]["nodeLabels"] == {"liqo.io/remote-cluster-id": "donor-a"}
    assert [f["name"] for f in wanted.cluster_queue["spec"]["resourceGroups"][0]["flavors"]][0] == "gpuo-donor-a-h100"


def test_two_models_on_one_donor_are_two_flavors_and_their_nodes_add_up() -> None:
    inventory = _pool(**{"b-gpu": node("b-gpu", "donor-a", 2, "A100"), "c-gpu": node("c-gpu", "donor-a", 1, "T4")})
    assert _gpu_quota(K.desired(inventory, TrustPolicy(), K.QueueSettings()).cluster_queue) == {
        "gpuo-donor-a-a100": "6", "gpuo-donor-a-t4": "1"}


def test_no_donor_means_a_queue_without_resource_groups(kueue_schema) -> None:
    wanted = K.desired(build_inventory([]), TrustPolicy(), K.QueueSettings())
    kueue_schema(wanted.cluster_queue)
    assert wanted.flavors == () and wanted.cluster_queue["spec"]["resourceGroups"] == []


def test_names_that_are_not_dns_names_are_cleaned_and_kept_apart() -> None:
    assert K.flavor_name("Donor_1", "A100 80GB") != K.flavor_name("donor-1", "a100-80gb")
    for name in (K.flavor_name("Donor_1", "A100 80GB"), K.flavor_name("x" * 300, None)):
        assert len(name) <= 253 and K._DNS_SUBDOMAIN.match(name)


def test_local_queue_and_priority_classes(kueue_schema) -> None:
    settings = K.QueueSettings(cluster_queue="pool", local_queue="gpus")
    wanted = K.desired(_pool(), TrustPolicy(), settings, ["jhub-bob", "jhub-alice", "jhub-bob"])
    assert [(q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]) for q in wanted.local_queues] == [
        ("jhub-alice", "gpus", {"clusterQueue": "pool"}), ("jhub-bob", "gpus", {"clusterQueue": "pool"})]
    assert [(c["metadata"]["name"], c["value"]) for c in wanted.priority_classes] == [
        ("interactive", 1000), ("batch", 100)]
    for obj in (*wanted.local_queues, *wanted.priority_classes):
        kueue_schema(obj)


def test_more_flavors_than_kueue_takes_leaves_the_dearest_out_with_a_warning(kueue_schema) -> None:
    nodes = {f"n{i}": node(f"n{i}", f"d{i:02d}", 1, "A100", **{"gpu-offload.io/price-per-gpu-hour": str(i)})
             for i in range(K.MAX_FLAVORS + 2)}
    wanted = K.desired(_inventory(**nodes), TrustPolicy(), K.QueueSettings())
    kueue_schema(wanted.cluster_queue)
    assert len(wanted.flavors) == K.MAX_FLAVORS
    assert "gpuo-d65-a100" in wanted.warnings[0] and "gpuo-d64-a100" in wanted.warnings[0]


def test_settings_from_the_chart_values() -> None:
    settings = K.queue_settings({"clusterQueue": "pool", "priorityClasses": [
        {"name": "urgent", "value": 5000}, {"name": "batch", "value": 10, "description": "whenever"}],
        "defaultPriority": "batch"})
    assert settings.cluster_queue == "pool" and settings.default_priority == "batch"
    assert settings.priority_classes == (K.PriorityClass("urgent", 5000), K.PriorityClass("batch", 10, "whenever"))
    assert K.queue_settings(None) == K.QueueSettings()



def test_a_class_kept_for_some_users_and_groups_is_allowed_to_them_only() -> None:
    settings = K.queue_settings({"priorityClasses": [
        {"name": "interactive", "value": 1000}, {"name": "urgent", "value": 5000, "users": ["ann"],
                                                 "groups": ["leads"]}], "defaultPriority": "interactive"})
    assert settings.allowed("ann") == ("interactive", "urgent")
    assert settings.allowed("bob", ["leads"]) == ("interactive", "urgent")
    assert settings.allowed("bob", ["physics"]) == ("interactive",)


@pytest.mark.parametrize(("raw", "message"), [
    ({"clusterQueue": "Pool"}, "queueing.kueue.clusterQueue='Pool' is not a name"),
    ({"localQueue": "gpu.queue"}, "localQueue='gpu.queue' is not a name pods can carry in a label"),
    ({"localQueue": "default"}, "localQueue='default' would make Kueue queue every unlabelled pod"),
    ({"priorityClasses": [{"name": "x", "value": "high"}]}, r"priorityClasses\[0\].value='high' must be a whole"),
    ({"priorityClasses": [{"name": "x", "value": 1}, {"name": "x", "value": 2}]}, "names a class twice"),
    ({"defaultPriority": "urgent"}, "defaultPriority='urgent' is not one of the priority classes"),
    ({"priorityClasses": [{"name": "x", "value": 1, "preempts": True}]}, "must be a mapping of name, value"),
    ({"priorityClasses": [{"name": "x", "value": 1, "users": "ann"}]}, r"priorityClasses\[0\].users must be a list"),
    ({"defaultPriority": "x", "priorityClasses": [{"name": "x", "value": 1, "groups": ["leads"]}]},
     "defaultPriority='x' is open to some users only"),
])
def test_bad_settings_name_the_key(raw, message) -> None:
    with pytest.raises(ValueError, match=message):
        K.queue_settings(raw)


def test_models_differing_only_in_case_get_flavors_of_their_own(kueue_schema) -> None:
    inventory = _pool(**{"b-gpu": node("b-gpu", "donor-a", 2, "a100")})
    queue = K.desired(inventory, TrustPolicy(), K.QueueSettings()).cluster_queue
    kueue_schema(queue)
    assert sorted(_gpu_quota(queue).values()) == ["2", "4"]


def test_the_validator_applies_the_crds_cel_rules(kueue_schema) -> None:
    # jsonschema alone accepts this; Kueue's rule "flavors must have the same number of resources as the
    # coveredResources" does not, so the validator the tests above rely on must catch it
    queue = K.desired(_pool(), TrustPolicy(), K.QueueSettings()).cluster_queue
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()
    with pytest.raises(AssertionError, match="same number of resources"):
        kueue_schema(queue)


def _kueue_019_matches(flavor: dict, affinity: dict) -> bool:
    """Kueue 0.19's flavor check: a term matches when each of its expressions on a key of the flavor's own
    nodeLabels is satisfied (expressions on other keys are ignored); any term matching is enough."""
    labels = flavor["spec"]["nodeLabels"]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(all(labels[e["key"]] in e["values"] for e in t["matchExpressions"] if e["key"] in labels)
               for t in terms)


def test_a_model_request_matches_only_the_flavors_of_that_model_on_kueue_019() -> None:
    # donor-a's model set by the admin (its flavor selects on the cluster id alone), donor-b labelled L4,
    # donor-c with an L4 and a T4 node (two flavors selecting on the model too)
    policy = TrustPolicy({"donor-a": ClusterPolicy(gpu_model="H100")})
    inventory = _pool(policy, **{"c-gpu": node("c-gpu", "donor-c", 2, "L4"), "d-gpu": node("d-gpu", "donor-c", 1, "T4")})
    flavors = {f["metadata"]["name"]: f for f in K.desired(inventory, policy, K.QueueSettings()).flavors}

    def admitted_to(*models: str, clusters: tuple[str, ...] = ()) -> set[str]:
        fragment = K.queued_scheduling(1, clusters, K.model_clusters(inventory, policy, models))
        return {name for name, f in flavors.items() if _kueue_019_matches(f, fragment["affinity"])}

    assert admitted_to("l4") == {"gpuo-donor-b-l4", "gpuo-donor-c-l4"}  # never donor-a's flavor
    assert admitted_to("H100") == {"gpuo-donor-a-h100"}
    assert admitted_to("T4", "H100") == {"gpuo-donor-c-t4", "gpuo-donor-a-h100"}
    assert admitted_to("L4", clusters=("donor-c",)) == {"gpuo-donor-c-l4"}
    with pytest.raises(ValueError, match="no cluster offers the GPU model asked for among donor-a"):
        K.queued_scheduling(1, ("donor-a",), K.model_clusters(inventory, policy, ["L4"]))
    # the pod's own node affinity still binds only to nodes of the model (the scheduler checks every key)
    spelt = K.model_clusters(inventory, policy, ["l4"])
    assert spelt == {"donor-b": ("L4",), "donor-c": ("L4",)}


def _sharing_node(name: str, cluster_id: str, mode: str, replicas: int, **resources: str):
    shared = node(name, cluster_id, 0, "A100", **{"gpu-offload.io/gpu-sharing": mode,
                                                 "gpu-offload.io/gpu-replicas": str(replicas),
                                                 "gpu-offload.io/gpu-memory": "80Gi",
                                                 "gpu-offload.io/price-per-gpu-hour": "1.0"})
    for key in ("capacity", "allocatable"):
        shared["status"][key].pop("nvidia.com/gpu", None)
        shared["status"][key].update(resources)
    return shared


def test_flavors_carry_the_shared_resources_so_parts_of_gpus_queue_like_whole_ones(kueue_schema) -> None:
    from gpu_offload.liqo_peering.shares import queued_ask
    from gpu_offload.liqo_peering.sharing import FractionRequest

    pool = _pool(**{"s-gpu": _sharing_node("s-gpu", "donor-s", "time-slicing", 4, **{"nvidia.com/gpu.shared": "8"}),
                    "m-gpu": _sharing_node("m-gpu", "donor-m", "mig", 1, **{"nvidia.com/mig-1g.10gb": "7"})})
    queue = K.desired(pool, TrustPolicy(), K.QueueSettings()).cluster_queue
    kueue_schema(queue)
    (group,) = queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared",
                                         "nvidia.com/mig-1g.10gb"]
    quotas = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}
    assert quotas["gpuo-donor-s-a100"]["nvidia.com/gpu.shared"] == "8"
    assert quotas["gpuo-donor-s-a100"]["nvidia.com/gpu"] == "0"  # shares are not whole GPUs
    assert quotas["gpuo-donor-m-a100"]["nvidia.com/mig-1g.10gb"] == "7"
    assert quotas["gpuo-donor-a-a100"]["nvidia.com/gpu.shared"] == "0"
    ask, clusters = queued_ask(pool.virtual_nodes, FractionRequest(0.5), (), [None], lambda vn: vn.price or 0.0)
    assert (ask.limits, clusters) == ({"nvidia.com/gpu.shared": 2}, ("donor-s",))
    fragment = K.queued_scheduling(1, clusters, None, ask.limits)
    assert fragment["resources"] == {"limits": {"nvidia.com/gpu.shared": "2"}}
