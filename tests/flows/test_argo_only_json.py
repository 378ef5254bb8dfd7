"""`argo-workflows create --only-json` with real Metaflow: the pod templates an offloaded flow deploys.

No cluster and no kubeconfig: Metaflow renders the WorkflowTemplate offline once its S3 datastore (moto)
answers. What users rely on: offloaded steps reach Liqo virtual nodes with their GPUs, everything the user
wrote on @kubernetes survives, other steps are exactly as without the extension, and every pod is valid.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import ONLY_JSON, FlowRunner, pod_from_template, templates, validate_pod

pytestmark = pytest.mark.slow

LIQO_TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


@pytest.fixture(scope="module")
def deployed(offload_deployment: dict[str, dict]) -> dict[str, dict]:
    """Step templates of the decorated flow (placed from the offline inventory) and of its baseline."""
    return {name: templates(workflow) for name, workflow in offload_deployment.items()}


def test_offloaded_step_gets_gpus_toleration_and_selector_for_its_model(deployed) -> None:
    train = deployed["offloaded"]["train"]
    assert train["container"]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert LIQO_TOLERATION in train["tolerations"]
    assert train["nodeSelector"] == {
        "liqo.io/type": "virtual-node",
        "liqo.io/remote-cluster-id": "donor-a",  # the inventory's only A100 donor
        "gpu-offload.io/gpu-model": "A100",
    }
    assert train["metadata"]["labels"]["gpu-offload.io/flow"] == "OffloadFlow"
    assert train["metadata"]["labels"]["gpu-offload.io/step"] == "train"
    # the hub's meter finds the step's pod and charges its GPU time to whoever deployed the flow
    assert train["metadata"]["labels"]["gpu-offload.io/managed-by"] == "gpu-offload"
    assert train["metadata"]["annotations"]["gpu-offload.io/user"]


def test_step_pinned_to_a_cluster_gets_that_cluster_selector(deployed) -> None:
    evaluate = deployed["offloaded"]["evaluate"]
    assert evaluate["container"]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert evaluate["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-b"
    assert LIQO_TOLERATION in evaluate["tolerations"]


def test_user_kubernetes_arguments_are_kept(deployed) -> None:
    train, before = deployed["offloaded"]["train"], deployed["baseline"]["train"]
    assert train["container"]["resources"]["requests"] == before["container"]["resources"]["requests"]
    assert train["container"]["resources"]["requests"]["memory"] == "8000M"
    assert train["metadata"]["labels"]["team"] == "ml"
    assert {"key": "spot", "operator": "Exists"} in train["tolerations"]
    assert train["container"]["image"] == before["container"]["image"]


def test_steps_without_the_decorator_are_untouched(deployed) -> None:
    for name in ("start", "end"):
        after, before = deployed["offloaded"][name], deployed["baseline"][name]
        for key in ("nodeSelector", "tolerations", "metadata", "volumes", "serviceAccountName"):
            assert after.get(key) == before.get(key), (name, key)
        assert after["container"]["resources"] == before["container"]["resources"]
        assert [e["name"] for e in after["container"]["env"]] == [e["name"] for e in before["container"]["env"]]


def test_the_decision_is_recorded_in_the_offloaded_pod_only(deployed) -> None:
    def recorded(template: dict) -> list[dict]:
        return [
            json.loads(e["value"]) for e in template["container"]["env"] if e["name"] == "METAFLOW_GPU_OFFLOAD_PLACEMENT"
        ]

    assert recorded(deployed["offloaded"]["train"]) == [
        {"step": "train", "gpus": 1, "cluster_id": "donor-a", "gpu_model": "A100", "namespace": None}
    ]
    assert recorded(deployed["offloaded"]["start"]) == []


def test_every_pod_template_is_a_valid_pod(deployed) -> None:
    assert set(deployed["offloaded"]) == {"start", "train", "evaluate", "end"}
    for template in deployed["offloaded"].values():
        validate_pod(pod_from_template(template))


def test_with_gpu_offload_on_the_command_line_offloads_every_step(run_flow: FlowRunner) -> None:
    # Argo runs every step in the workflow's namespace: the offloaded namespace is Metaflow's own setting.
    env = {
        "METAFLOW_GPU_OFFLOAD_CLUSTER": "donor-a",
        "METAFLOW_KUBERNETES_NAMESPACE": "gpu-jobs",
        # Metaflow's own defaults for every @kubernetes step still apply to offloaded ones.
        "METAFLOW_KUBERNETES_NODE_SELECTOR": "disk=ssd",
        "METAFLOW_KUBERNETES_TOLERATIONS": '[{"key": "spot", "operator": "Exists"}]',
    }
    workflow = run_flow("plain_flow.py", "--with", "gpu_offload:gpus=2", *ONLY_JSON, env=env).json()
    assert workflow["metadata"]["namespace"] == "gpu-jobs"
    found = templates(workflow)
    assert set(found) == {"start", "end"}
    for template in found.values():
        assert template["container"]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert LIQO_TOLERATION in template["tolerations"]
        assert template["nodeSelector"]["liqo.io/remote-cluster-id"] == "donor-a"
        assert template["nodeSelector"]["disk"] == "ssd"
        assert {"key": "spot", "operator": "Exists"} in template["tolerations"]
        validate_pod(pod_from_template(template))


@pytest.mark.parametrize(
    "case, expected",
    [
        ("gpus-not-integer", "@gpu_offload(gpus='two') is not a whole number of GPUs"),
        ("gpus-float", "@gpu_offload(gpus=1.5) is not a whole number of GPUs"),
        ("unknown-argument", "@gpu_offload has no argument gpu"),
        ("conflict-gpu", "@kubernetes(gpu=2) conflicts with @gpu_offload(gpus=1)"),
        ("conflict-resources", "@resources(gpu=2) conflicts with @gpu_offload(gpus=1)"),
        ("conflict-selector", "conflicts with @gpu_offload(gpus=1, cluster='donor-a')"),
    ],
)
def test_bad_input_stops_before_anything_is_deployed(run_flow: FlowRunner, case: str, expected: str) -> None:
    # placed from configuration, on a trusted cluster: without one the step would be refused for that first
    result = run_flow("bad_flow.py", *ONLY_JSON, env={"BAD_CASE": case, "METAFLOW_GPU_OFFLOAD_CLUSTER": "donor-a"})
    assert result.returncode != 0
    assert expected in result.stderr
    assert "step 'train'" in result.stderr
    assert "Traceback" not in result.stderr
    assert "{" not in result.stdout  # no workflow template was printed
    assert run_flow.s3.keys(run_flow.workdir.name) == []  # and no code package was uploaded


@pytest.mark.parametrize(
    "inventory, expected",
    [
        ({"clusters": [{"id": "donor-a", "virtual_nodes": [{"name": "n", "gpus": 4, "model": "A100"}]}]},
         "no peered cluster 'donor-b'; valid: donor-a"),
        ({"clusters": [{"id": "donor-b", "virtual_nodes": [{"name": "n", "gpus": 4, "model": "L4"}]}]},
         "no virtual node has GPU model 'A100'; models: L4"),
    ],
    ids=["unknown-cluster", "model-nobody-offers"],
)
def test_inventory_rejects_what_no_donor_has(
    run_flow: FlowRunner, tmp_path: Path, inventory: dict, expected: str
) -> None:
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps(inventory))
    result = run_flow("offload_flow.py", *ONLY_JSON, env={"METAFLOW_GPU_OFFLOAD_INVENTORY": str(path)})
    assert result.returncode != 0
    assert expected in result.stderr
    assert str(path) in result.stderr
    assert "{" not in result.stdout
