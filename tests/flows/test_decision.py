"""Placement of a step: from config, from an offline inventory, and replayed offline from the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_offload.flows.decision import StepPlacement, decide, decide_queued, recorded_placement
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


# donor-t time-slices under the plain nvidia.com/gpu (4 shares a GPU), donor-s lends MPS shares renamed
# nvidia.com/gpu.shared, donor-a lends whole GPUs: Metaflow's @kubernetes can ask only donor-t for a part
SHARING = {"clusters": [
    {"cluster_id": c, "name": c, "role": "Provider", "health": "healthy", "virtual_nodes": [
        {"name": f"liqo-{c}", "cluster_id": c, "capacity": whole, "allocatable": whole, "in_use": 0, "model": "A100",
         "memory": "80Gi", "sharing": mode, "replicas": replicas, "devices": [[resource, count, 0]]}]}
    for c, mode, replicas, resource, count, whole in (
        ("donor-a", "none", 1, "nvidia.com/gpu", 2, 2),
        ("donor-s", "mps", 2, "nvidia.com/gpu.shared", 4, 0),
        ("donor-t", "time-slicing", 4, "nvidia.com/gpu", 8, 0))]}


def test_part_of_a_gpu_goes_to_a_donor_lending_shares_as_nvidia_gpu_and_becomes_that_many_shares() -> None:
    from gpu_offload.flows.kubernetes_args import StepIdentity, kubernetes_kwargs
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    inventory = inventory_from_dict(SHARING)
    options = parse_options("train", (), {"gpus": 0.5, "untrusted_ok": True})
    assert (options.gpus, options.fraction, options.describe()) == (1, 0.5, "@gpu_offload(gpus=0.5, untrusted_ok=True)")
    placed = decide("train", options, OffloadSettings(), inventory, "inventory")
    assert (placed.cluster_id, placed.gpus, placed.share) == ("donor-t", 2, 0.5)  # two of its four shares
    assert recorded_placement("train", placed.to_json()) == StepPlacement(
        "train", 2, "donor-t", None, None, "recorded", share=0.5)
    args = kubernetes_kwargs({}, placed, StepIdentity("F", "train", None, "alice"), options.describe())
    assert (args["gpu"], args["node_selector"]["liqo.io/remote-cluster-id"]) == (2, "donor-t")
    memory = decide("train", parse_options("train", (), {"gpu_memory": "12Gi", "untrusted_ok": True}),
                    OffloadSettings(), inventory, "inventory")
    assert (memory.cluster_id, memory.gpus, memory.share) == ("donor-t", 1, 0.25)


def test_part_of_a_gpu_is_refused_where_no_donor_lends_it_as_nvidia_gpu_or_nothing_says_how_donors_share() -> None:
    from gpu_offload.liqo_peering.inventory import inventory_from_dict

    no_plain = inventory_from_dict({"clusters": SHARING["clusters"][:2]})
    options = parse_options("train", (), {"gpus": 0.5, "untrusted_ok": True})
    with pytest.raises(GpuOffloadFlowError, match=r"step 'train' @gpu_offload\(gpus=0.5, untrusted_ok=True\): no donor "
                                                  r"lends part of a GPU as nvidia.com/gpu. Metaflow's @kubernetes"):
        decide("train", options, OffloadSettings(), no_plain, "inventory")
    with pytest.raises(GpuOffloadFlowError, match="only the cluster or an inventory tells"):
        decide("train", options, OffloadSettings(), None, "config")
    with pytest.raises(GpuOffloadFlowError, match="part of a GPU is placed, not queued"):
        decide_queued("train", options, OffloadSettings(queue="q"), ("donor-t",))
    with pytest.raises(GpuOffloadFlowError, match="gpu_memory asks for part of one GPU"):
        parse_options("train", (), {"gpus": 2, "gpu_memory": "12Gi"})
    with pytest.raises(GpuOffloadFlowError, match="is not a size"):
        parse_options("train", (), {"gpu_memory": "lots"})
