"""Placement of a step: from config, from an offline inventory, and replayed offline from the record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.flows.decision import StepPlacement, decide, decide_queued, queued, recorded_placement
from gpu_offload.flows.errors import GpuOffloadFlowError
from gpu_offload.flows.inventory_file import load_inventory
from gpu_offload.flows.mutation import place_step
from gpu_offload.flows.options import OffloadOptions, parse_options
from gpu_offload.flows.settings import RECORDED_ENV, OffloadSettings, read_settings

DATA = Path(__file__).resolve().parent / "data"
INVENTORY = str(DATA / "inventory.json")


@pytest.fixture(autouse=True)
def trusting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The origin trusts the inventory's donors (tests of the refusal unset it)."""
    monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_CLUSTERS", "donor-a,donor-b")


def test_steps_go_to_trusted_clusters_only_unless_they_say_untrusted_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_OFFLOAD_TRUSTED_CLUSTERS", "donor-a")
    inventory = load_inventory(INVENTORY)  # donor-b alone has L4s, and is not trusted
    with pytest.raises(GpuOffloadFlowError, match=r"step 'train' @gpu_offload\(gpus=1, gpu_model='L4'\): no cluster "
                       r"has 1 free L4.*only trusted clusters were asked for, and donor-b is not trusted.*Metaflow's "
                       r"artifacts are pickles.*@gpu_offload\(untrusted_ok=True\)"):
        decide("train", OffloadOptions(gpu_model="L4"), OffloadSettings(), inventory, "inventory")
    assert decide("train", OffloadOptions(), OffloadSettings(), inventory, "inventory").cluster_id == "donor-a"
    options = parse_options("train", (), {"gpu_model": "L4", "untrusted_ok": True})
    assert decide("train", options, OffloadSettings(), inventory, "inventory").cluster_id == "donor-b"
    with pytest.raises(GpuOffloadFlowError, match="untrusted_ok='yes'.*True or False"):
        parse_options("train", (), {"untrusted_ok": "yes"})


def test_without_an_inventory_a_step_must_be_pinned_to_a_trusted_cluster() -> None:
    offline, environ = OffloadSettings(source="config"), {"GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-a"}
    with pytest.raises(GpuOffloadFlowError, match="no cluster is named.*trusted: donor-a.*untrusted_ok=True"):
        place_step("train", OffloadOptions(), offline, environ)
    with pytest.raises(GpuOffloadFlowError, match="cluster donor-b is not trusted"):
        place_step("train", OffloadOptions(cluster="donor-b"), offline, environ)
    assert place_step("train", OffloadOptions(cluster="donor-a"), offline, environ).cluster_id == "donor-a"
    assert place_step("train", OffloadOptions(untrusted_ok=True), offline, environ).cluster_id is None


def test_settings_come_from_metaflow_style_keys() -> None:
    conf = {"GPU_OFFLOAD_CLUSTER": "donor-b", "GPU_OFFLOAD_GPU_MODEL": " L4 ", "GPU_OFFLOAD_PLACEMENT_SOURCE": "config"}
    assert read_settings(conf.get) == OffloadSettings(cluster="donor-b", gpu_model="L4", source="config")
    with pytest.raises(GpuOffloadFlowError, match="METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=.cloud. is not allowed"):
        read_settings({"GPU_OFFLOAD_PLACEMENT_SOURCE": "cloud"}.get)


def test_config_alone_pins_the_configured_cluster_and_model() -> None:
    placed = decide("train", OffloadOptions(gpus=1), OffloadSettings(cluster="donor-b", gpu_model="L4"), None, "config")
    assert (placed.cluster_id, placed.gpu_model, placed.origin) == ("donor-b", "L4", "config")


def test_the_decorator_wins_over_the_configured_defaults() -> None:
    options = OffloadOptions(gpus=1, gpu_model="A100", cluster="donor-a")
    placed = decide("train", options, OffloadSettings(cluster="donor-b", gpu_model="L4"), None, "config")
    assert (placed.cluster_id, placed.gpu_model) == ("donor-a", "A100")


def test_inventory_chooses_a_cluster_that_has_the_model() -> None:
    placed = decide("train", OffloadOptions(gpu_model="l4"), OffloadSettings(), load_inventory(INVENTORY), "inventory")
    # matched case-insensitively, written as the nodes are labelled
    assert (placed.cluster_id, placed.gpu_model) == ("donor-b", "L4")


def test_a_list_of_models_is_tried_in_order() -> None:
    options = parse_options("train", [], {"gpu_model": ["A100", "L4"], "gpus": 3})
    assert (options.gpu_model, options.fallback_models) == ("A100", ("L4",))
    inventory = load_inventory(INVENTORY)
    placed = decide("train", options, OffloadSettings(), inventory, "inventory")
    assert (placed.cluster_id, placed.gpu_model) == ("donor-a", "A100")
    # donor-a has 4 A100: six GPUs fit nowhere, and the message names the list as the user wrote it
    with pytest.raises(GpuOffloadFlowError, match=r"@gpu_offload\(gpus=6, gpu_model=\['A100', 'L4'\]\)"):
        decide("train", parse_options("train", [], {"gpu_model": ["A100", "L4"], "gpus": 6}), OffloadSettings(),
               inventory, "inventory")
    # L4 first: donor-b's 2 L4 cannot take 3 GPUs, so the step falls back to A100
    placed = decide("train", parse_options("train", [], {"gpu_model": ["L4", "A100"], "gpus": 3}),
                    OffloadSettings(), inventory, "inventory")
    assert (placed.cluster_id, placed.gpu_model) == ("donor-a", "A100")


def test_inventory_refuses_more_gpus_than_any_donor_has() -> None:
    with pytest.raises(GpuOffloadFlowError) as caught:
        decide("train", OffloadOptions(gpus=8), OffloadSettings(inventory=INVENTORY), load_inventory(INVENTORY), "inventory")
    assert "step 'train' @gpu_offload(gpus=8)" in str(caught.value)
    assert INVENTORY in str(caught.value)


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ('{"clusters": {}}', "no 'clusters' list"),
        ('{"clusters": [{"name": "x"}]}', "has no 'id'"),
        ('{"clusters": [{"id": "a", "virtual_nodes": [{"name": "n", "gpus": "4"}]}]}', "an integer 'gpus'"),
    ],
)
def test_a_bad_inventory_file_is_named_with_its_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "inv.json"
    path.write_text(content)
    with pytest.raises(GpuOffloadFlowError, match=message) as caught:
        load_inventory(str(path))
    assert str(path) in str(caught.value)


def test_a_missing_inventory_file_says_which_setting_to_fix(tmp_path: Path) -> None:
    with pytest.raises(GpuOffloadFlowError, match="fix METAFLOW_GPU_OFFLOAD_INVENTORY"):
        load_inventory(str(tmp_path / "absent.json"))


def test_inside_the_pod_the_recorded_decision_is_reused_without_any_lookup(tmp_path: Path) -> None:
    decided = StepPlacement("train", 1, "donor-a", "A100", "gpu-jobs", "live")
    # An inventory that would now refuse the step, and a live source: neither is consulted.
    settings = OffloadSettings(inventory=str(tmp_path / "absent.json"), source="live")
    again = place_step("train", OffloadOptions(gpus=1), settings, {RECORDED_ENV: decided.to_json()})
    assert again == StepPlacement("train", 1, "donor-a", "A100", "gpu-jobs", "recorded")
    assert again.to_json() == decided.to_json()


def test_a_record_for_another_step_is_ignored_and_a_corrupt_one_is_an_error() -> None:
    other = StepPlacement("evaluate", 1, "donor-b", None, None, "config").to_json()
    assert recorded_placement("train", other) is None
    with pytest.raises(GpuOffloadFlowError, match="unset METAFLOW_GPU_OFFLOAD_PLACEMENT"):
        recorded_placement("train", json.dumps({"step": "train", "gpus": "many"}))


def test_options_are_checked_with_the_step_named() -> None:
    assert parse_options("s", [], {"gpus": "3"}) == OffloadOptions(gpus=3)
    for bad in ({"gpus": 0}, {"gpus": True}, {"gpus": None}, {"cluster": ""}, {"gpu_model": 7},
                {"gpu_model": []}, {"gpu_model": ["A100", ""]}):
        with pytest.raises(GpuOffloadFlowError, match="step 's'"):
            parse_options("s", [], bad)
    with pytest.raises(GpuOffloadFlowError, match="keyword arguments only"):
        parse_options("s", [1], {})


def test_placement_hints_are_written_as_decorator_arguments() -> None:
    from gpu_offload.flows.decision import as_decorator_hint

    assert as_decorator_hint("(use --gpu-model L4 or --gpus 2)") == "(use @gpu_offload(gpu_model='L4') or @gpu_offload(gpus=2))"


def test_the_configured_policy_places_the_step() -> None:
    settings = read_settings({"GPU_OFFLOAD_PLACEMENT_POLICY": "bin-pack"}.get)
    assert settings.policy == "bin-pack"
    inventory = load_inventory(INVENTORY)
    # donor-a has 4 free GPUs, donor-b 2: most-free spreads to donor-a, bin-pack fills donor-b
    assert decide("train", OffloadOptions(gpus=1), OffloadSettings(), inventory, "inventory").cluster_id == "donor-a"
    assert decide("train", OffloadOptions(gpus=1), settings, inventory, "inventory").cluster_id == "donor-b"
    with pytest.raises(GpuOffloadFlowError, match="METAFLOW_GPU_OFFLOAD_PLACEMENT_POLICY=.fastest. is not allowed"):
        read_settings({"GPU_OFFLOAD_PLACEMENT_POLICY": "fastest"}.get)


def test_under_kueue_no_donor_is_picked_only_what_the_step_narrows() -> None:
    queued = OffloadSettings(source="config", queue="gpu-offload")
    inventory = load_inventory(INVENTORY)
    # no free-GPU search: Kueue picks the flavor when it admits the Job (the inventory's donor-a would fit)
    free = place_step("train", OffloadOptions(untrusted_ok=True, gpu_model="a100"), queued, {})
    assert (free.cluster_id, free.queue, free.origin) == (None, "gpu-offload", "kueue")
    assert free.gpu_model == "a100"
    # with the cluster's inventory the model is spelled as the nodes' label, and a pinned name is resolved
    from gpu_offload.flows.decision import decide_queued

    spelled = decide_queued("train", OffloadOptions(untrusted_ok=True, gpu_model="a100"), queued, (), inventory)
    assert (spelled.cluster_id, spelled.gpu_model) == (None, "A100")
    with pytest.raises(GpuOffloadFlowError, match="pinned to cluster donor-z, which is not peered"):
        decide_queued("train", OffloadOptions(cluster="donor-z"), queued, ("donor-z",), inventory)
    # a pin stays a pin; a step that may use trusted clusters only is pinned to the only one
    trusted = {"GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-a"}
    assert place_step("train", OffloadOptions(cluster="donor-a"), queued, trusted).cluster_id == "donor-a"
    assert place_step("train", OffloadOptions(), queued, trusted).cluster_id == "donor-a"
    with pytest.raises(GpuOffloadFlowError, match="cluster donor-b is not trusted.*untrusted_ok=True"):
        place_step("train", OffloadOptions(cluster="donor-b"), queued, trusted)
    with pytest.raises(GpuOffloadFlowError, match=r"Kueue picks the donor.*only one cluster.*not the trusted ones "
                                                  r"\(donor-a, donor-b;.*cluster=\.\.\."):
        place_step("train", OffloadOptions(), queued, {"GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-a,donor-b"})
    with pytest.raises(GpuOffloadFlowError, match=r"only one GPU model.*gpu_model='A100'\), or none"):
        place_step("train", parse_options("train", (), {"gpu_model": ["A100", "L4"], "untrusted_ok": True}),
                   queued, {})


# donor-a lends whole GPUs, donor-s MPS shares renamed nvidia.com/gpu.shared (two a GPU), donor-t time-slices under
# the plain nvidia.com/gpu (four shares a GPU); each lends part of a GPU in its own units
def _sharing(*donors: tuple[str, str, int, str, int, int, float | None]) -> dict[str, Any]:
    return {"clusters": [
        {"cluster_id": c, "name": c, "role": "Provider", "health": "healthy", "virtual_nodes": [
            {"name": f"liqo-{c}", "cluster_id": c, "capacity": whole, "allocatable": whole, "in_use": 0,
             "model": "A100", "memory": "80Gi", "sharing": mode, "replicas": replicas, "price": price,
             "devices": [[resource, count, 0]]}]}
        for c, mode, replicas, resource, count, whole, price in donors]}


WHOLE = ("donor-a", "none", 1, "nvidia.com/gpu", 2, 2, None)
MPS = ("donor-s", "mps", 2, "nvidia.com/gpu.shared", 4, 0, None)
SLICED = ("donor-t", "time-slicing", 4, "nvidia.com/gpu", 8, 0, None)
SHARING = _sharing(WHOLE, MPS, SLICED)
GIB = 2**30


def test_part_of_a_gpu_is_placed_in_its_donors_units_and_the_step_is_told_its_part() -> None:
    from gpu_offload.flows.kubernetes_args import StepIdentity, environment_vars, kubernetes_kwargs
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    inventory = inventory_from_dict(SHARING)
    options = parse_options("train", (), {"gpus": 0.5, "untrusted_ok": True})
    assert (options.gpus, options.fraction, options.describe()) == (1, 0.5, "@gpu_offload(gpus=0.5, untrusted_ok=True)")
    # half a GPU is one MPS share on donor-s or two time-sliced shares on donor-t: the same part, and donor-s is
    # left fuller (fractions pack together), as placement does for a cell
    placed = decide("train", options, OffloadSettings(), inventory, "inventory")
    assert (placed.cluster_id, placed.share, placed.resources) == ("donor-s", 0.5, (("nvidia.com/gpu.shared", 1),))
    told = {"GPU_OFFLOAD_GPU_SHARING": "mps", "GPU_OFFLOAD_GPU_ISOLATION": "compute and memory",
            "GPU_OFFLOAD_GPU_MEMORY_LIMIT": str(40 * GIB)}
    assert dict(placed.part) == told
    assert recorded_placement("train", placed.to_json()) == dataclasses.replace(placed, origin="recorded")
    # Metaflow's gpu= names nvidia.com/gpu only: the units go in extended_resources (requests and limits)
    args = kubernetes_kwargs({}, placed, StepIdentity("F", "train", None, "alice"), options.describe())
    assert "gpu" not in args
    assert (args["extended_resources"], args["node_selector"]["liqo.io/remote-cluster-id"]) == (
        {"nvidia.com/gpu.shared": "1"}, "donor-s")
    env = environment_vars({"A": "1"}, placed, options.describe())
    assert {k: v for k, v in env.items() if k != RECORDED_ENV} == {"A": "1", **told}
    # 12 GiB of an 80 GiB GPU: one time-sliced share (a quarter) holds less of a GPU than an MPS half
    memory = decide("train", parse_options("train", (), {"gpu_memory": "12Gi", "untrusted_ok": True}),
                    OffloadSettings(), inventory, "inventory")
    assert (memory.cluster_id, memory.share, memory.resources) == ("donor-t", 0.25, (("nvidia.com/gpu", 1),))
    assert dict(memory.part) == {"GPU_OFFLOAD_GPU_SHARING": "time-slicing", "GPU_OFFLOAD_GPU_ISOLATION": "none",
                                 "GPU_OFFLOAD_GPU_FRACTION": "0.25"}
    # a GPU count on @kubernetes would add nvidia.com/gpu beside the part: refused, naming the part
    with pytest.raises(GpuOffloadFlowError, match=r"@kubernetes\(gpu=1\) conflicts with @gpu_offload\(gpus=0.5, "
                                                  r"untrusted_ok=True\), which asks its donor for \{'nvidia.com/"
                                                  r"gpu.shared': '1'\} in its units, not nvidia.com/gpu; drop gpu from "
                                                  r"@kubernetes"):
        kubernetes_kwargs({"gpu": 1}, placed, StepIdentity("F", "train"), options.describe())
    with pytest.raises(GpuOffloadFlowError, match="extended_resources.*conflicts with"):
        kubernetes_kwargs({"extended_resources": {"nvidia.com/gpu.shared": "2"}}, placed, StepIdentity("F", "train"),
                          options.describe())
    with pytest.raises(GpuOffloadFlowError, match="@environment sets GPU_OFFLOAD_GPU_SHARING"):
        environment_vars({"GPU_OFFLOAD_GPU_SHARING": "none"}, placed, options.describe())


def test_part_of_a_gpu_is_refused_where_no_donor_lends_it_or_nothing_says_how_donors_share() -> None:
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    options = parse_options("train", (), {"gpus": 0.5, "untrusted_ok": True})
    with pytest.raises(GpuOffloadFlowError, match=r"step 'train' @gpu_offload\(gpus=0.5, untrusted_ok=True\): no "
                                                  r"cluster can lend 0.5 of a GPU; donor-a: this donor lends whole GPUs "
                                                  r"only"):
        decide("train", options, OffloadSettings(), inventory_from_dict(_sharing(WHOLE)), "inventory")
    with pytest.raises(GpuOffloadFlowError, match="only the cluster or an inventory tells"):
        decide("train", options, OffloadSettings(), None, "config")
    with pytest.raises(GpuOffloadFlowError, match="gpu_memory asks for part of one GPU"):
        parse_options("train", (), {"gpus": 2, "gpu_memory": "12Gi"})
    with pytest.raises(GpuOffloadFlowError, match="is not a size"):
        parse_options("train", (), {"gpu_memory": "lots"})


def test_a_queued_part_asks_in_the_units_kueues_flavors_count_and_is_pinned_where_a_node_selector_must() -> None:
    from gpu_offload.flows.kubernetes_args import StepIdentity, kubernetes_kwargs, queue_labels
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    kueue = OffloadSettings(source="config", queue="gpu-offload")
    half = parse_options("train", (), {"gpus": 0.5, "untrusted_ok": True})
    # donor-u lends MPS halves as donor-s does; donor-v time-slices four shares under the same renamed resource, so
    # one nvidia.com/gpu.shared is a quarter there and its flavor counts it too
    same = ("donor-u", "mps", 2, "nvidia.com/gpu.shared", 4, 0, 1.0)
    other = ("donor-v", "time-slicing", 4, "nvidia.com/gpu.shared", 8, 0, 2.0)
    cheap_mps = (*MPS[:-1], 1.0)
    alone = decide_queued("train", half, kueue, (), inventory_from_dict(_sharing(WHOLE, cheap_mps, same)))
    # no other flavor counts nvidia.com/gpu.shared: Kueue picks between the two MPS donors
    assert (alone.cluster_id, alone.origin, alone.share, alone.resources) == (
        None, "kueue", 0.5, (("nvidia.com/gpu.shared", 1),))
    # the runner of a queued share is told the part, not the cheapest donor's bytes (shares.queued_part)
    assert dict(alone.part) == {"GPU_OFFLOAD_GPU_SHARING": "mps", "GPU_OFFLOAD_GPU_ISOLATION": "compute and memory",
                                "GPU_OFFLOAD_GPU_FRACTION": "0.5"}
    step = queued(alone, half, kueue)
    args = kubernetes_kwargs({}, step, StepIdentity("F", "train"), half.describe())
    assert args["extended_resources"] == {"nvidia.com/gpu.shared": "1"} and "gpu" not in args
    assert queue_labels(step) == {"kueue.x-k8s.io/queue-name": "gpu-offload"}
    assert recorded_placement("train", step.to_json()) == dataclasses.replace(step, origin="recorded")
    # donor-v's flavor counts the same resource as a quarter: a node selector names one cluster, so the step must
    mixed = inventory_from_dict(_sharing(WHOLE, cheap_mps, same, other))
    with pytest.raises(GpuOffloadFlowError, match=(
            r"step 'train' @gpu_offload\(gpus=0.5, untrusted_ok=True\): queueing through Kueue is on \(LocalQueue "
            r"gpu-offload\), so Kueue picks the donor for 0.5 of a GPU \(1 nvidia.com/gpu.shared\): those units are "
            r"that part of a GPU on donor-s, donor-u, while donor-v counts them too as another part of a GPU.*pin the step to "
            r"one of those that lend it so: @gpu_offload\(cluster='donor-s'\) or @gpu_offload\(cluster='donor-u'\)")):
        decide_queued("train", half, kueue, (), mixed)
    pinned = decide_queued("train", parse_options("train", (), {"gpus": 0.5, "cluster": "donor-u"}), kueue,
                           ("donor-u",), mixed)
    assert (pinned.cluster_id, pinned.resources) == ("donor-u", (("nvidia.com/gpu.shared", 1),))
    # one donor lends it so (the time-sliced one, the only that can): pinned to it without being asked
    sliced = decide_queued("train", half, kueue, (), inventory_from_dict(_sharing(WHOLE, SLICED)))
    assert (sliced.cluster_id, sliced.resources, sliced.share) == ("donor-t", (("nvidia.com/gpu", 2),), 0.5)
    # a step that may use trusted clusters only is pinned to the one trusted: in that donor's units
    trusted = decide_queued("train", parse_options("train", (), {"gpu_memory": "12Gi"}), kueue, ("donor-t",),
                            inventory_from_dict(SHARING))
    assert (trusted.cluster_id, trusted.resources, trusted.share) == ("donor-t", (("nvidia.com/gpu", 1),), 0.25)


def test_a_queued_part_is_refused_before_anything_where_it_cannot_be_asked() -> None:
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    kueue = OffloadSettings(source="config", queue="gpu-offload")
    half = parse_options("train", (), {"gpus": 0.5, "cluster": "donor-a"})
    with pytest.raises(GpuOffloadFlowError, match=r"queueing through Kueue is on \(LocalQueue gpu-offload\), and part "
                                                  r"of a GPU is asked for in the units its donor lends GPUs in, which "
                                                  r"only the cluster or an inventory tells"):
        decide_queued("train", half, kueue, ("donor-a",))
    with pytest.raises(GpuOffloadFlowError, match=r"queueing through Kueue is on \(LocalQueue gpu-offload\): no "
                                                  r"cluster can lend 0.5 of a GPU; donor-a: this donor lends whole GPUs"):
        decide_queued("train", half, kueue, ("donor-a",), inventory_from_dict(SHARING))
    # more than one MPS share: NVIDIA's device plugin grants one per pod
    with pytest.raises(GpuOffloadFlowError, match=r"donor-s: this donor shares each GPU by MPS as 2 parts of 40 GiB; "
                                                  r"one pod gets one part"):
        decide_queued("train", parse_options("train", (), {"gpus": 0.75, "cluster": "donor-s"}), kueue,
                      ("donor-s",), inventory_from_dict(SHARING))


def test_queued_whole_gpus_keep_off_donors_whose_nvidia_gpu_counts_shares_or_slots() -> None:
    from gpu_offload.flows.kubernetes_args import StepIdentity, kubernetes_kwargs
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    kueue = OffloadSettings(source="config", queue="gpu-offload")
    one = OffloadOptions(untrusted_ok=True)
    # every donor lends whole GPUs: nothing narrows the step
    assert decide_queued("train", one, kueue, (), inventory_from_dict(_sharing(WHOLE))).cluster_id is None
    # donor-t's flavor counts nvidia.com/gpu as time-sliced shares: held to the donor that lends whole GPUs
    held = decide_queued("train", one, kueue, (), inventory_from_dict(_sharing(WHOLE, SLICED)))
    assert (held.cluster_id, held.resources, held.share) == ("donor-a", (), None)
    other = ("donor-b", "none", 1, "nvidia.com/gpu", 2, 2, None)
    with pytest.raises(GpuOffloadFlowError, match=r"Kueue picks the donor for 1 whole GPU: those units are whole GPUs "
                                                  r"on donor-a, donor-b, while donor-t counts them too as another part "
                                                  r"of a GPU.*@gpu_offload\(cluster='donor-a'\) or @gpu_offload\("
                                                  r"cluster='donor-b'\)"):
        decide_queued("train", one, kueue, (), inventory_from_dict(_sharing(WHOLE, other, SLICED)))
    # no donor lends whole GPUs: one GPU asks a memory isolator for a slot and all of its GPU's memory
    isolator = {"clusters": [{"cluster_id": "donor-h", "name": "donor-h", "role": "Provider", "health": "healthy",
                              "virtual_nodes": [{"name": "liqo-donor-h", "cluster_id": "donor-h", "capacity": 10,
                                                 "allocatable": 10, "in_use": 0, "model": "A100", "memory": "80Gi",
                                                 "sharing": "memory", "devices": [["nvidia.com/gpu", 10, 0],
                                                                                  ["nvidia.com/gpumem", 81920, 0]]}]},
                             *_sharing(SLICED)["clusters"]]}
    slot = decide_queued("train", one, kueue, (), inventory_from_dict(isolator))
    assert (slot.cluster_id, slot.resources) == ("donor-h", (("nvidia.com/gpu", 1), ("nvidia.com/gpumem", 81920)))
    args = kubernetes_kwargs({}, slot, StepIdentity("F", "train"), one.describe())
    assert args["extended_resources"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "81920"} and "gpu" not in args
    with pytest.raises(GpuOffloadFlowError, match=r"no donor lends 2 whole GPUs to a queued run: donor-t: its "
                                                  r"nvidia.com/gpu counts time-slicing shares, not whole GPUs; ask for "
                                                  r"part of a GPU \(@gpu_offload\(gpus=0.5\)\)"):
        decide_queued("train", OffloadOptions(gpus=2, untrusted_ok=True), kueue, (), inventory_from_dict(
            _sharing(SLICED)))


def test_an_offline_inventory_says_how_donors_share_so_a_queued_part_needs_no_cluster(tmp_path: Path) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"clusters": [
        {"id": "donor-a", "virtual_nodes": [{"name": "liqo-donor-a", "gpus": 2, "model": "A100"}]},
        {"id": "donor-t", "virtual_nodes": [{"name": "liqo-donor-t", "gpus": 0, "model": "A100", "memory": "80Gi",
                                             "sharing": "time-slicing", "replicas": 4,
                                             "resources": {"nvidia.com/gpu.shared": 8}}]}]}))
    # a hub user's server: placement from configuration (the user may not read nodes), the admin's inventory file
    kueue = OffloadSettings(source="config", queue="gpu-offload", inventory=str(path))
    step = place_step("train", parse_options("train", (), {"gpu_memory": "30Gi"}), kueue,
                      {"GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-t"})
    assert (step.cluster_id, step.queue, step.resources, step.share) == (
        "donor-t", "gpu-offload", (("nvidia.com/gpu.shared", 2),), 0.5)
    for entry, message in ((({"sharing": "slices"}), "'slices' is not a sharing mode"),
                           (({"sharing": "mps", "replicas": "2"}), "'replicas' must be an integer"),
                           (({"resources": {"gpu": 2}}), "'resources' must map nvidia.com/ resources"),
                           (({"memory": "lots", "sharing": "mig"}), "'lots' is not a memory quantity")):
        path.write_text(json.dumps({"clusters": [{"id": "x", "virtual_nodes": [
            {"name": "n", "gpus": 1, **entry}]}]}))
        with pytest.raises(GpuOffloadFlowError, match=f"inventory {path}: .*{message}"):
            load_inventory(str(path))
