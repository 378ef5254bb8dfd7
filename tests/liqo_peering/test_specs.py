"""Spec builders: literal expected objects, validated against the real schemas (built-in kinds and Liqo CRDs)."""

from __future__ import annotations

import base64
import copy
import json
import re
import types

import jsonschema
import kubernetes
import pytest
from gpu_offload.liqo_peering.errors import BundleTooLarge, InvalidRequest
from gpu_offload.liqo_peering.placement import scheduling_fragment
from gpu_offload.liqo_peering.specs import (
    RunnerPodSpec,
    check_secret_size,
    gpu_resource_slice,
    label_value,
    merge_offloading,
    namespace_offloading,
    runner_pod,
    runner_secret,
    runner_selector,
)

VN_TERM = {"key": "liqo.io/type", "operator": "In", "values": ["virtual-node"]}


def roundtrip(obj: dict, model: str) -> dict:
    """Through the official client's model and back: drops any field the client does not know."""
    client = kubernetes.client.ApiClient()
    typed = client.deserialize(types.SimpleNamespace(data=json.dumps(obj)), model)
    return client.sanitize_for_serialization(typed)


def test_validators_can_fail(liqo_schema, k8s_schema) -> None:
    bad = namespace_offloading("alice")
    bad["spec"]["podOffloadingStrategy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        liqo_schema(bad)
    with pytest.raises(jsonschema.ValidationError):
        k8s_schema({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "c", "image": "i", "runAsRoot": True}]}})


def test_namespace_offloading(liqo_schema) -> None:
    obj = namespace_offloading("alice", ["donor-c", "donor-b"])
    assert obj == {
        "apiVersion": "offloading.liqo.io/v1beta1",
        "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading", "namespace": "alice", "labels": {"gpu-offload.io/managed-by": "gpu-offload"}},
        "spec": {
            "podOffloadingStrategy": "Local",
            "clusterSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                VN_TERM, {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-b", "donor-c"]},
            ]}]},
        },
    }
    assert "namespaceMappingStrategy" not in obj["spec"]
    liqo_schema(obj)
    liqo_schema(namespace_offloading("bob"))
    with pytest.raises(InvalidRequest, match="podOffloadingStrategy 'Both'"):
        namespace_offloading("bob", strategy="Both")
    with pytest.raises(InvalidRequest, match="namespace 'Bob_NS' is not a DNS label"):
        namespace_offloading("Bob_NS")


def existing(terms: list, mapping: str = "EnforceSameName") -> dict:
    return {
        "apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
        "metadata": {"name": "offloading", "namespace": "team", "resourceVersion": "42", "uid": "u1"},
        "spec": {"namespaceMappingStrategy": mapping, "podOffloadingStrategy": "LocalAndRemote",
                 "clusterSelector": {"nodeSelectorTerms": terms}},
        "status": {"offloadingPhase": "Ready"},
    }


def test_merge_adds_a_term_and_keeps_others_clusters(liqo_schema) -> None:
    theirs = {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-a"]}]}
    old = existing([theirs])
    before = copy.deepcopy(old)
    merged = merge_offloading(old, ["donor-c"])
    assert old == before  # pure: the input is untouched
    assert merged is not None
    assert merged["spec"]["clusterSelector"]["nodeSelectorTerms"] == [
        theirs,
        {"matchExpressions": [VN_TERM, {"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["donor-c"]}]},
    ]
    assert merged["spec"]["namespaceMappingStrategy"] == "EnforceSameName"
    assert merged["metadata"]["resourceVersion"] == "42"
    liqo_schema(merged)


def test_merge_is_a_no_op_when_already_selected() -> None:
    assert merge_offloading(existing([{"matchExpressions": [VN_TERM]}]), ["donor-c"]) is None
    assert merge_offloading(existing([]), ["donor-c"]) is None  # empty selector: all clusters
    in_list = {"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["a", "c"]}]}
    assert merge_offloading(existing([in_list]), ["c", "a"]) is None


def test_merge_judges_terms_on_other_labels_with_known_node_labels() -> None:
    by_model = {"matchExpressions": [{"key": "gpu-offload.io/gpu-model", "operator": "In", "values": ["A100"]}]}
    old = existing([by_model])
    assert merge_offloading(old, ["c"], {"c": {"gpu-offload.io/gpu-model": "A100"}}) is None
    merged = merge_offloading(old, ["c"], {"c": {"gpu-offload.io/gpu-model": "L4"}})
    assert merged is not None and len(merged["spec"]["clusterSelector"]["nodeSelectorTerms"]) == 2


def test_merge_widens_a_local_namespace_and_keeps_its_strategy() -> None:
    # Local is what the project writes: its own pods carry their toleration and affinity, others stay home
    old = existing([{"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": ["a"]}]}])
    old["spec"]["podOffloadingStrategy"] = "Local"
    merged = merge_offloading(old, ["c"])
    assert merged is not None and merged["spec"]["podOffloadingStrategy"] == "Local"
    assert len(merged["spec"]["clusterSelector"]["nodeSelectorTerms"]) == 2


def test_gpu_resource_slice(liqo_schema) -> None:
    # labels and annotation as liqoctl's forge.MutateResourceSlice writes them (Liqo v1.2): without the
    # replication labels Liqo neither signs nor sends the slice, without the annotation it makes no virtual node
    obj = gpu_resource_slice("gpu-donor-b", "liqo-tenant-donor-b", "origin", "donor-b", 4, cpu="8", memory="32Gi")
    assert obj == {
        "apiVersion": "authentication.liqo.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": "gpu-donor-b", "namespace": "liqo-tenant-donor-b",
                     "labels": {"gpu-offload.io/managed-by": "gpu-offload", "liqo.io/remote-cluster-id": "donor-b",
                                "liqo.io/replication": "true", "liqo.io/remoteID": "donor-b"},
                     "annotations": {"liqo.io/create-virtual-node": "true"}},
        "spec": {"class": "default", "consumerClusterID": "origin", "providerClusterID": "donor-b",
                 "resources": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"}},
    }
    liqo_schema(obj)
    with pytest.raises(InvalidRequest, match="gpus=0"):
        gpu_resource_slice("s", "t", "origin", "donor-b", 0)


def spec(**kw) -> RunnerPodSpec:
    base = dict(run_id="r1a2", namespace="alice", image="python:3.11", user="alice@example.org",
                kernel="k-42", scheduling=scheduling_fragment("donor-b", 1), timeout=600)
    base.update(kw)
    return RunnerPodSpec(**base)


def test_runner_pod(k8s_schema) -> None:
    pod = runner_pod(spec(cpu="2", memory="8Gi"))
    user_label = label_value("alice@example.org")
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gpuo-r1a2",
            "namespace": "alice",
            "labels": {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": user_label,
                       "gpu-offload.io/kernel": "k-42", "gpu-offload.io/run-id": "r1a2"},
            "annotations": {"gpu-offload.io/user": "alice@example.org", "gpu-offload.io/kernel": "k-42"},
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "activeDeadlineSeconds": 600,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "runner",
                "image": "python:3.11",
                "command": ["python3", "/gpu-offload/runner.pyz", "--bundle", "-"],
                "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"},
                        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"},
                              "requests": {"cpu": "2", "memory": "8Gi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "volumeMounts": [{"name": "runner", "mountPath": "/gpu-offload", "readOnly": True}],
                "stdin": True, "stdinOnce": True, "tty": False,
            }],
            "volumes": [{"name": "runner", "secret": {"secretName": "gpuo-r1a2-runner", "defaultMode": 0o444}}],
            # a lost donor's pod is evicted 10 s after its node is marked unreachable, not Kubernetes' 300 s
            "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 10},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 10}],
            "affinity": scheduling_fragment("donor-b", 1)["affinity"],
        },
    }
    k8s_schema(pod)
    assert roundtrip(pod, "V1Pod") == pod


def test_session_pod_reads_stdin_and_may_run_without_deadline(k8s_schema) -> None:
    pod = runner_pod(spec(session=True, timeout=None, env={"CUDA_VISIBLE_DEVICES": "0"}))
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python3", "/gpu-offload/runner.pyz", "--session"]
    assert (container["stdin"], container["stdinOnce"], container["tty"]) == (True, False, False)
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": "0"} in container["env"]
    assert "activeDeadlineSeconds" not in pod["spec"]
    k8s_schema(pod)


def test_a_queued_pod_tolerates_a_lost_node_as_long_as_set_and_nothing_else_of_kubernetes() -> None:
    pod = runner_pod(spec(scheduling={"resources": {"limits": {"nvidia.com/gpu": "1"}}}, node_lost_seconds=30))
    assert pod["spec"]["tolerations"] == [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]


@pytest.mark.parametrize(
    "kw, text",
    [({"timeout": 0}, "timeout=0s"), ({"image": ""}, "no image; pass --image"),
     ({"run_id": "Run_1"}, "pod name \\(from run id\\) 'gpuo-Run_1' is not a DNS label"),
     ({"node_lost_seconds": -1}, "node-lost toleration of -1 s: give 0 seconds or more")],
)
def test_runner_pod_bad_input(kw, text) -> None:
    with pytest.raises(InvalidRequest, match=text):
        runner_pod(spec(**kw))


@pytest.mark.parametrize("raw", ["alice", "alice@example.org", "x" * 80, "@@@", "Ünïcode user"])
def test_label_values_are_valid_and_distinct(raw) -> None:
    # The API server's rule for label values (the JSON schemas do not carry it).
    value = label_value(raw)
    assert len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value)
    if raw == "alice":
        assert value == "alice"  # valid values pass unchanged, so selectors by user stay readable
    assert label_value(raw + "!") != value


def test_runner_secret_is_owned_by_the_pod_holds_only_the_runner_and_is_marked_for_reflection(k8s_schema) -> None:
    pod = runner_pod(spec())
    secret = runner_secret(pod, "3f1c-uid", b"PK\x03\x04zip")
    assert secret == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": "gpuo-r1a2-runner",
            "namespace": "alice",
            "labels": pod["metadata"]["labels"],
            "annotations": {"liqo.io/allow-reflection": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "gpuo-r1a2", "uid": "3f1c-uid"}],
        },
        "data": {"runner.pyz": base64.b64encode(b"PK\x03\x04zip").decode()},
    }
    assert secret["metadata"]["name"] == pod["spec"]["volumes"][0]["secret"]["secretName"]
    k8s_schema(secret)
    assert roundtrip(secret, "V1Secret") == secret


def test_too_large_bundle_fails_before_anything_is_built() -> None:
    with pytest.raises(BundleTooLarge, match=r"^run r1a2: bundle \(1048000 bytes\) plus runner \(100 bytes\)"):
        check_secret_size("r1a2", 1_048_000, 100)
    check_secret_size("r1a2", 900_000, 100_000)  # fits: no error
    pod = runner_pod(spec())
    with pytest.raises(BundleTooLarge, match=r"bundle \(0 bytes\) plus runner \(1048576 bytes\)"):
        runner_secret(pod, "uid", b"x" * 1024 * 1024)
    with pytest.raises(InvalidRequest, match="no pod uid; create the pod first"):
        runner_secret(pod, "", b"r")


def test_runner_selector_matches_the_labels_the_builders_wrote() -> None:
    labels = runner_pod(spec())["metadata"]["labels"]
    selector = runner_selector(user="alice@example.org", kernel="k-42")
    pairs = dict(term.split("=", 1) for term in selector.split(","))
    assert pairs == {k: labels[k] for k in pairs}
    assert set(pairs) == {"gpu-offload.io/managed-by", "gpu-offload.io/user", "gpu-offload.io/kernel"}
    assert runner_selector() == "gpu-offload.io/managed-by=gpu-offload"


def test_a_runner_pod_under_a_server_in_a_hub_carries_the_sweep_labels_and_the_meter_finalizer(k8s_schema) -> None:
    pod = runner_pod(spec(server="hub-default", kernel_pid=4242, metered=True))
    k8s_schema(pod)
    meta = pod["metadata"]
    assert meta["labels"]["gpu-offload.io/server"] == "hub-default"
    assert meta["labels"]["gpu-offload.io/kernel-pid"] == "4242"
    assert meta["finalizers"] == ["gpu-offload.io/metered"]
    plain = runner_pod(spec())["metadata"]  # without a hub meter nobody would remove it: none
    assert "finalizers" not in plain and "gpu-offload.io/server" not in plain["labels"]


def test_a_queued_runner_pod_names_its_local_queue_and_priority_class(k8s_schema) -> None:
    pod = runner_pod(spec(queue="gpu-offload", priority_class="batch"))
    k8s_schema(pod)
    labels = pod["metadata"]["labels"]
    assert (labels["kueue.x-k8s.io/queue-name"], labels["kueue.x-k8s.io/priority-class"]) == ("gpu-offload", "batch")
    assert "kueue.x-k8s.io/priority-class" not in runner_pod(spec(queue="gpu-offload"))["metadata"]["labels"]
    # without a queue the pod is not Kueue's: no label that would make Kueue's webhook gate it
    assert not any(k.startswith("kueue.x-k8s.io/") for k in runner_pod(spec())["metadata"]["labels"])


@pytest.mark.parametrize(("kw", "text"), [
    ({"priority_class": "batch"}, "priority class 'batch' but no queue: queueing through Kueue is off"),
    ({"queue": "GPU queue"}, "Kueue queue 'GPU queue' is not a DNS label"),
    ({"queue": "q", "priority_class": "x" * 64}, "Kueue priority class 'x{64}' is not a DNS label"),
])
def test_queue_labels_bad_input(kw, text) -> None:
    with pytest.raises(InvalidRequest, match=text):
        runner_pod(spec(**kw))


def test_a_one_shot_pod_starts_importing_what_its_cell_imports_first(k8s_schema) -> None:
    pod = runner_pod(spec(preimport=("torch",)))
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python3", "/gpu-offload/runner.pyz", "--bundle", "-", "--preimport", "torch"]
    k8s_schema(pod)
