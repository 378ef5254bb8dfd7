"""The @kubernetes arguments an offloaded step gets: merged with the user's, conflicts named."""

from __future__ import annotations

import json

import pytest
from gpu_offload.flows.decision import StepPlacement
from gpu_offload.flows.errors import GpuOffloadFlowError
from gpu_offload.flows.kubernetes_args import (
    LIQO_TOLERATION,
    StepIdentity,
    environment_vars,
    kubernetes_kwargs,
    label_value,
)

PLACED = StepPlacement("train", 2, "donor-a", "A100", None, "inventory")
WHO = StepIdentity("TrainFlow", "train", "argo-trainflow-x7")
OFFLOAD = "@gpu_offload(gpus=2)"


def test_adds_gpu_toleration_selector_and_labels_to_nothing() -> None:
    assert kubernetes_kwargs({}, PLACED, WHO, OFFLOAD) == {
        "gpu": 2,
        "node_selector": {
            "liqo.io/type": "virtual-node",
            "liqo.io/remote-cluster-id": "donor-a",
            "gpu-offload.io/gpu-model": "A100",
        },
        "tolerations": [LIQO_TOLERATION],
        "labels": {
            "gpu-offload.io/managed-by": "gpu-offload",
            "gpu-offload.io/flow": "TrainFlow",
            "gpu-offload.io/step": "train",
            "gpu-offload.io/run-id": "argo-trainflow-x7",
        },
    }


def test_keeps_every_user_argument() -> None:
    user = {
        "memory": 16000,
        "image": "pytorch/pytorch:2.5",
        "node_selector": "disk=ssd",
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "labels": {"team": "ml"},
        "namespace": "ml-jobs",
        "gpu": 2,
    }
    merged = kubernetes_kwargs(user, StepPlacement("train", 2, None, None, "gpu-jobs", "config"), WHO, OFFLOAD)
    assert merged["memory"] == 16000 and merged["image"] == "pytorch/pytorch:2.5"
    assert merged["node_selector"] == {"disk": "ssd", "liqo.io/type": "virtual-node"}
    assert merged["tolerations"] == [{"key": "spot", "operator": "Exists"}, LIQO_TOLERATION]
    assert merged["labels"]["team"] == "ml"
    assert merged["namespace"] == "ml-jobs"  # the user's namespace wins over the configured default


def test_configured_namespace_applies_when_the_user_gave_none() -> None:
    placed = StepPlacement("train", 1, None, None, "gpu-jobs", "config")
    assert kubernetes_kwargs({}, placed, WHO, OFFLOAD)["namespace"] == "gpu-jobs"


def test_an_existing_liqo_toleration_is_not_duplicated() -> None:
    user = {"tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists"}]}
    assert len(kubernetes_kwargs(user, PLACED, WHO, OFFLOAD)["tolerations"]) == 1


@pytest.mark.parametrize(
    "user, message",
    [
        ({"gpu": 4}, "@kubernetes(gpu=4) conflicts with @gpu_offload(gpus=2)"),
        ({"gpu": 0}, "@kubernetes(gpu=0) conflicts with @gpu_offload(gpus=2)"),
        ({"gpu_vendor": "amd"}, "@kubernetes(gpu_vendor='amd') conflicts with @gpu_offload(gpus=2)"),
        (
            {"node_selector": {"liqo.io/remote-cluster-id": "donor-z"}},
            "@kubernetes(node_selector={'liqo.io/remote-cluster-id': 'donor-z'}) conflicts with @gpu_offload",
        ),
        ({"labels": {"gpu-offload.io/step": "other"}}, "@kubernetes(labels={'gpu-offload.io/step': 'other'})"),
        ({"node_selector": 5}, "@kubernetes(node_selector=5) is neither a dict nor 'key=value,...'"),
    ],
)
def test_a_contradiction_names_both_decorators_and_the_step(user: dict, message: str) -> None:
    with pytest.raises(GpuOffloadFlowError) as caught:
        kubernetes_kwargs(user, PLACED, WHO, OFFLOAD)
    assert message in str(caught.value)
    assert "step 'train'" in str(caught.value)


def test_same_gpu_count_on_both_decorators_is_fine() -> None:
    assert kubernetes_kwargs({"gpu": 2, "gpu_vendor": "nvidia"}, PLACED, WHO, OFFLOAD)["gpu"] == 2


def test_label_values_are_made_valid() -> None:
    assert label_value("My Flow/step#1") == "My-Flow-step-1"
    assert label_value("_x_") == "x"
    assert len(label_value("a" * 80)) == 63


def test_environment_records_the_decision_next_to_the_users_variables() -> None:
    env = environment_vars({"WANDB_MODE": "offline"}, PLACED, OFFLOAD)
    assert env["WANDB_MODE"] == "offline"
    assert env["METAFLOW_GPU_OFFLOAD_PLACEMENT"] == PLACED.to_json()
    with pytest.raises(GpuOffloadFlowError, match="remove it from @environment"):
        environment_vars({"METAFLOW_GPU_OFFLOAD_PLACEMENT": "{}"}, PLACED, OFFLOAD)


def test_run_label_is_added_to_the_kubernetes_step_command_only() -> None:
    from gpu_offload.flows.run_label import add_run_label

    options = {"run-id": "1795", "labels": '{"team": "ml"}'}
    add_run_label(["kubernetes", "step"], options)
    assert json.loads(options["labels"]) == {"team": "ml", "gpu-offload.io/run-id": "1795"}
    local = {"run-id": "1795"}
    add_run_label(["step"], local)
    assert local == {"run-id": "1795"}


def test_the_flows_user_is_written_for_the_hubs_meter_and_no_user_label_invites_kernel_cleanup() -> None:
    who = StepIdentity("TrainFlow", "train", user="alice@example.org")
    merged = kubernetes_kwargs({"annotations": {"team": "ml"}}, PLACED, who, OFFLOAD)
    assert merged["annotations"] == {"team": "ml", "gpu-offload.io/user": "alice@example.org"}
    assert merged["labels"]["gpu-offload.io/managed-by"] == "gpu-offload"
    assert "gpu-offload.io/user" not in merged["labels"]  # runner_selector(user) stays the kernels' own
    with pytest.raises(GpuOffloadFlowError, match="annotations"):
        kubernetes_kwargs({"annotations": {"gpu-offload.io/user": "mallory"}}, PLACED, who, OFFLOAD)


def test_a_queued_step_carries_kueues_labels_and_they_survive_the_record() -> None:
    from dataclasses import replace

    from gpu_offload.flows.decision import queued, recorded_placement
    from gpu_offload.flows.options import parse_options
    from gpu_offload.flows.settings import read_settings

    # the hub's spawner set the user's server queue and default class; the step asks for batch
    settings = read_settings({}.get, {"GPU_OFFLOAD_QUEUE": "gpu-offload", "GPU_OFFLOAD_PRIORITY": "interactive"})
    step = queued(PLACED, parse_options("train", [], {"gpus": 2, "priority": "batch"}), settings)
    labels = kubernetes_kwargs({}, step, WHO, OFFLOAD)["labels"]
    assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/priority-class"]) == ("gpu-offload", "batch")
    # the step's pod and the local trampoline read the same queue back from the recorded placement
    assert replace(recorded_placement("train", step.to_json()), origin="inventory") == step  # type: ignore[arg-type]
    default = queued(PLACED, parse_options("train", [], {"gpus": 2}), settings)
    assert default.priority == "interactive"
    mine = read_settings({"GPU_OFFLOAD_QUEUE": "mine"}.get, {"GPU_OFFLOAD_QUEUE": "gpu-offload"})
    assert mine.queue == "mine"  # METAFLOW_GPU_OFFLOAD_QUEUE wins over the hub's
    # without a queue: no Kueue label, and a priority is refused before anything is deployed
    assert "kueue.x-k8s.io/queue-name" not in kubernetes_kwargs({}, PLACED, WHO, OFFLOAD)["labels"]
    with pytest.raises(GpuOffloadFlowError, match=r"priority='batch'.*queueing through Kueue is off here"):
        queued(PLACED, parse_options("train", [], {"gpus": 2, "priority": "batch"}), read_settings({}.get))


def test_a_run_step_tolerates_a_lost_node_as_briefly_as_runner_pods_and_keeps_the_users_own() -> None:
    from gpu_offload.flows.run_label import add_node_lost_tolerations

    spot = {"key": "spot", "operator": "Exists"}
    options = {"tolerations": json.dumps([spot, LIQO_TOLERATION])}
    add_node_lost_tolerations(["kubernetes", "step"], options, 7)
    # snake_case: `kubernetes step` hands each one to the client's V1Toleration
    assert json.loads(options["tolerations"]) == [spot, LIQO_TOLERATION, *[
        {"key": key, "operator": "Exists", "effect": "NoExecute", "toleration_seconds": 7}
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]]
    theirs = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
              "toleration_seconds": 600}
    options = {"tolerations": json.dumps([theirs])}
    add_node_lost_tolerations(["kubernetes", "step"], options, 7)
    assert [t["key"] for t in json.loads(options["tolerations"])] == [
        "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]
    assert json.loads(options["tolerations"])[0] == theirs  # the user's own limit stands
    local = {"tolerations": "[]"}
    add_node_lost_tolerations(["step"], local, 7)
    assert local == {"tolerations": "[]"}


def test_the_node_lost_seconds_of_a_flow_are_the_kernels_setting_and_a_bad_one_stops_the_flow() -> None:
    from gpu_offload.flows.settings import read_settings

    assert read_settings({}.get, {}).node_lost_seconds == 10
    assert read_settings({}.get, {"GPU_OFFLOAD_NODE_LOST_SECONDS": "3"}).node_lost_seconds == 3
    with pytest.raises(GpuOffloadFlowError, match="GPU_OFFLOAD_NODE_LOST_SECONDS"):
        read_settings({}.get, {"GPU_OFFLOAD_NODE_LOST_SECONDS": "soon"})
