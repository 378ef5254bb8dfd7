"""Pure decisions of the emulated Kueue: flavor assignment and its messages, victims of preemption,
Admission Fair Sharing's decay and the queue order it gives."""

from __future__ import annotations

from decimal import Decimal

from gpu_offload.sandbox.kueue.ledger import UsageLedger
from gpu_offload.sandbox.kueue.preemption import Admitted, victims
from gpu_offload.sandbox.kueue.scheduler import (
    Entry,
    Flavor,
    assign,
    decayed,
    entry_penalty,
    matching_flavors,
    order,
)

GPU = "nvidia.com/gpu"
A, B = Flavor("a", {GPU: Decimal(2)}), Flavor("b", {GPU: Decimal(4)})


def test_first_flavor_with_room_wins_and_messages_say_why_not():
    assert assign({GPU: Decimal(2)}, [GPU], [A, B], {}).flavor == "a"
    assert assign({GPU: Decimal(2)}, [GPU], [A, B], {"a": {GPU: Decimal(1)}}).flavor == "b"
    full = assign({GPU: Decimal(3)}, [GPU], [A, B], {"b": {GPU: Decimal(2)}})
    assert full.flavor is None and full.fits_ever
    # as Kueue's flavor assigner: one reason per flavor tried, sorted, joined
    assert full.message == ("couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
                            "flavor a, previously considered podsets requests (0) + current podset request (3) > "
                            "maximum capacity (2), insufficient unused quota for nvidia.com/gpu in flavor b, 1 more "
                            "needed")
    busy = assign({GPU: Decimal(1)}, [GPU], [A], {"a": {GPU: Decimal(2)}})
    assert busy.message.endswith("insufficient unused quota for nvidia.com/gpu in flavor a, 1 more needed")
    uncovered = assign({GPU: Decimal(1), "cpu": Decimal(1)}, [GPU], [A], {})
    assert not uncovered.fits_ever and "resource cpu unavailable in ClusterQueue" in uncovered.message
    never = assign({GPU: Decimal(5)}, [GPU], [A, B], {})
    assert (full.fits_ever, busy.fits_ever, never.fits_ever, uncovered.fits_ever) == (True, True, False, False)


def test_a_pods_node_affinity_limits_the_flavors_it_may_get():
    # as Kueue's flavor assigner: only keys the flavor labels count, so the unrelated type label is ignored
    labels = {"a": {"liqo.io/remote-cluster-id": "one"}, "b": {"liqo.io/remote-cluster-id": "two"}}
    pinned = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["two"]},
            {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}]}]}}}}}
    assert matching_flavors([pinned], labels) == frozenset({"b"})
    assert matching_flavors([{"spec": {"nodeSelector": {"liqo.io/remote-cluster-id": "one"}}}], labels) == {"a"}
    assert matching_flavors([{"spec": {"nodeSelector": {"other": "x"}}}], labels) is None
    # Kueue 0.19: each flavor on its own keys. A flavor without the model key matches a model request (the
    # scheduler then finds no node: the project narrows model requests by cluster id for this)
    mixed = {"any": {"liqo.io/remote-cluster-id": "one"},
             "l4": {"liqo.io/remote-cluster-id": "two", "gpu-offload.io/gpu-model": "L4"}}
    model = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu-offload.io/gpu-model", "operator": "In", "values": ["A100"]}]}]}}}}}
    assert matching_flavors([model], mixed) == frozenset({"any"})
    assert matching_flavors([{"spec": {"nodeSelector": {"gpu-offload.io/gpu-model": "L4"}}}], mixed) == {"any", "l4"}
    entry = Entry("ns", "w", "q", 0, "2026-01-01T00:00:00Z", flavors=frozenset({"b"}))
    assert assign({GPU: Decimal(2)}, [GPU], [A, B], {}, entry).flavor == "b"  # a has room but is not allowed
    nowhere = assign({GPU: Decimal(1)}, [GPU], [A], {}, entry)
    assert nowhere.flavor is None and nowhere.message.endswith("flavor a doesn't match node affinity")
    assert not nowhere.fits_ever
    busy = assign({GPU: Decimal(3)}, [GPU], [A, B], {"b": {GPU: Decimal(2)}}, entry)
    assert busy.message == ("couldn't assign flavors to pod set main: flavor a doesn't match node affinity, "
                            "insufficient unused quota for nvidia.com/gpu in flavor b, 1 more needed")


def test_victims_are_lowest_priority_then_newest_and_no_more_than_needed():
    admitted = [Admitted("n", "old-low", 1, "a", {GPU: Decimal(1)}, "2026-01-01T00:00:01Z"),
                Admitted("n", "new-low", 1, "a", {GPU: Decimal(1)}, "2026-01-01T00:00:02Z"),
                Admitted("n", "mid", 5, "b", {GPU: Decimal(4)}, "2026-01-01T00:00:00Z")]
    used = {"a": {GPU: Decimal(2)}, "b": {GPU: Decimal(4)}}
    flavor, chosen = victims({GPU: Decimal(1)}, 10, [A, B], admitted, used)
    assert (flavor, [v.name for v in chosen]) == ("a", ["new-low"])
    assert victims({GPU: Decimal(1)}, 1, [A, B], admitted, used) is None  # equal priority is never preempted
    flavor, chosen = victims({GPU: Decimal(3)}, 10, [A, B], admitted, used)
    assert (flavor, [v.name for v in chosen]) == ("b", ["mid"])


def test_usage_halves_after_a_half_life_and_admissions_count_at_once():
    assert decayed({GPU: 8.0}, {}, 600, 600) == {GPU: 4.0}
    assert decayed({}, {GPU: 2.0}, 600, 600) == {GPU: 1.0}
    assert entry_penalty({GPU: Decimal(4)}, 300, 300) == {GPU: 2.0}


def test_fair_sharing_orders_by_queue_usage_before_priority():
    heavy = Entry("ann", "w1", "q", 100, "2026-01-01T00:00:00Z", uid="b")
    light = Entry("bob", "w2", "q", 0, "2026-01-01T00:00:09Z", uid="a")
    assert order([heavy, light]) == [heavy, light]  # without AFS: priority first
    assert order([heavy, light], {"ann/q": 3.0, "bob/q": 0.5}) == [light, heavy]


def test_a_tie_within_one_second_goes_to_the_lower_workload_uid_not_the_first_arrival():
    # Kueue's baseCompareFunc: priority, then the queue time in whole seconds, then the Workload's UID
    first = Entry("ann", "w1", "q", 0, "2026-01-01T00:00:00Z", uid="f0")
    second = Entry("bob", "w2", "q", 0, "2026-01-01T00:00:00Z", uid="0f")
    later = Entry("cat", "w3", "q", 0, "2026-01-01T00:00:01Z", uid="00")
    assert order([first, second, later]) == [second, first, later]


def test_excluded_resource_prefixes_leave_a_resource_out_of_quota_as_kueue_does():
    from gpu_offload.sandbox.kueue.workloads import requests

    # a Metaflow step pod: ephemeral-storage besides the GPU, which a GPU-only ClusterQueue does not cover
    template = {"spec": {"containers": [{"name": "main", "resources": {
        "limits": {GPU: "1"}, "requests": {"ephemeral-storage": "10240M"}}}]}}
    workload = {"spec": {"podSets": [{"name": "main", "count": 1, "template": template}]}}
    asked = requests(workload)
    assert "resource ephemeral-storage unavailable in ClusterQueue" in assign(asked, [GPU], [A], {}).message
    kept = requests(workload, ("ephemeral-storage",))
    assert kept == {GPU: Decimal(1)} and assign(kept, [GPU], [A], {}).flavor == "a"


def test_entry_penalty_stays_in_the_usage_and_decays_like_the_rest():
    now = [0.0]
    ledger = UsageLedger(half_life=600, sampling=300, resource_weights={"memory": 0}, clock=lambda: now[0])
    ledger.sample({}, ["a/q", "b/q"])
    ledger.admit("a/q", {GPU: Decimal(1), "memory": Decimal(2**30)}, {GPU: 1.0, "memory": 2.0**30})
    penalty = 1 - 0.5 ** 0.5
    assert abs(ledger.usage({})["a/q"] - penalty) < 1e-9  # memory weighted 0: GPUs alone count
    assert ledger.usage({"a/q": 2.0})["a/q"] < ledger.usage({})["a/q"]  # a heavier LocalQueue counts less
    now[0] = 300.0  # the next sample, the pod still running: the penalty is history now, not dropped
    assert ledger.sample({"a/q": {GPU: 1.0}}, ["a/q", "b/q"]) == {"a/q", "b/q"}
    assert abs(ledger.entries["a/q"].consumed[GPU] - (penalty * 0.5 ** 0.5 + penalty)) < 1e-9
    assert ledger.usage({})["b/q"] == 0.0
