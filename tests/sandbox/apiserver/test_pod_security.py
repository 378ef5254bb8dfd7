"""The sandbox enforces a namespace's Pod Security level on pod creation, with kube-apiserver's wording."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering.specs import RunnerPodSpec, runner_pod
from gpu_offload.sandbox.apiserver.podsecurity import violations

SERVER_TOKEN = "eyJhbGciOiJSUzI1NiJ9.user-server-of-jhub-alice"  # what a user's server presents


def _spec(**container: Any) -> dict[str, Any]:
    return {"containers": [{"name": "main", "image": "python:3.12", **container}]}


RESTRICTED_OK = {"securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}


def test_a_bare_pod_breaks_restricted_in_the_real_plugins_words_and_order() -> None:
    found = [str(v) for v in violations(_spec(securityContext={"privileged": True}), "restricted")]
    assert found == [
        'privileged (container "main" must not set securityContext.privileged=true)',
        'allowPrivilegeEscalation != false (container "main" must set securityContext.allowPrivilegeEscalation=false)',
        'unrestricted capabilities (container "main" must set securityContext.capabilities.drop=["ALL"])',
        'runAsNonRoot != true (pod or container "main" must set securityContext.runAsNonRoot=true)',
        'seccompProfile (pod or container "main" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")',
    ]


def test_baseline_refuses_the_escapes_and_nothing_else() -> None:
    spec = {**_spec(ports=[{"containerPort": 80, "hostPort": 80}],
                    securityContext={"capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN", "CHOWN"]}}),
            "hostNetwork": True, "hostPID": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
    assert [str(v) for v in violations(spec, "baseline")] == [
        'non-default capabilities (container "main" must not include "NET_ADMIN", "SYS_ADMIN" in '
        "securityContext.capabilities.add)",
        "host namespaces (hostNetwork=true, hostPID=true)",
        'hostPath volumes (volume "root")',
        'hostPort (container "main" uses hostPort 80)',
    ]
    assert violations(_spec(), "baseline") == []  # what restricted adds is not baseline's business
    assert violations(spec, "privileged") == []


def test_pod_level_settings_cover_every_container_and_explicit_bad_values_are_named() -> None:
    spec = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "a", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    assert violations(spec, "restricted") == []
    spec["containers"].append({"name": "b", "image": "x", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsUser": 0,
        "seccompProfile": {"type": "Unconfined"}}})
    assert [str(v) for v in violations(spec, "restricted")] == [
        'runAsUser=0 (container "b" must not set runAsUser=0)',
        'seccompProfile (container "b" must not set securityContext.seccompProfile.type to "Unconfined")',
    ]


def test_runner_pods_meet_restricted() -> None:
    pod = runner_pod(RunnerPodSpec(run_id="r1", namespace="jhub-alice", image="python:3.11-slim", user="alice",
                                   kernel="k1", scheduling={"resources": {"limits": {"nvidia.com/gpu": 1}}}))
    assert violations(pod["spec"], "restricted") == []


@pytest.fixture()
def server_core(api_sandbox: Any) -> Iterator[kubernetes.client.CoreV1Api]:
    """The official client as a user's server uses it: a bearer token of its service account."""
    config = kubernetes.client.Configuration(host=api_sandbox.url)
    config.api_key = {"authorization": SERVER_TOKEN}
    config.api_key_prefix = {"authorization": "Bearer"}
    with kubernetes.client.ApiClient(config) as client:
        yield kubernetes.client.CoreV1Api(client)


@pytest.fixture()
def labelled(core: kubernetes.client.CoreV1Api) -> Iterator[Any]:
    made: list[str] = []

    def make(level: str | None) -> str:
        name = f"ps-{uuid.uuid4().hex[:8]}"
        labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
        made.append(name)
        return name

    yield make
    for name in made:
        core.delete_namespace(name)


def test_a_user_server_token_cannot_create_a_privileged_pod_in_a_restricted_namespace(
    server_core: kubernetes.client.CoreV1Api, labelled: Any, pod: Any
) -> None:
    ns = labelled("restricted")
    body = pod("escape")
    body["spec"]["containers"][0]["securityContext"] = {**RESTRICTED_OK["securityContext"], "privileged": True}
    with pytest.raises(kubernetes.client.ApiException) as refused:
        server_core.create_namespaced_pod(ns, body)
    status = json.loads(refused.value.body)
    assert (refused.value.status, status["reason"], status["code"]) == (403, "Forbidden", 403)
    assert status["message"] == ('pods "escape" is forbidden: violates PodSecurity "restricted:latest": privileged '
                                 '(container "main" must not set securityContext.privileged=true)')
    assert server_core.list_namespaced_pod(ns).items == []  # nothing stored
    # the same pod without the escape is admitted
    body["spec"]["containers"][0]["securityContext"]["privileged"] = False
    server_core.create_namespaced_pod(ns, body)


def test_baseline_and_unlabelled_namespaces_through_the_client(
    core: kubernetes.client.CoreV1Api, labelled: Any, pod: Any
) -> None:
    host_path = pod("hp", volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod(labelled("baseline"), host_path)
    assert refused.value.status == 403
    assert json.loads(refused.value.body)["message"] == (
        'pods "hp" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "root")')
    core.create_namespaced_pod(labelled("baseline"), pod("plain"))  # restricted's rules are not baseline's
    core.create_namespaced_pod(labelled(None), host_path)  # no label: privileged, as in Kubernetes
