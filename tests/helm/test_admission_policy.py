"""The ValidatingAdmissionPolicy confines the hub's cluster-wide creations to user namespaces.

No API server runs here, so the policy's CEL expressions are evaluated with cel-python against admission
requests shaped as the API server builds them (request, object, namespaceObject): the expressions are the
rendered ones, unchanged, and the API server's rule applies: the policy only judges requests that its
match conditions select, and any validation not true (false or an error, failurePolicy Fail) denies.
"""

from __future__ import annotations

from typing import Any

import celpy
import pytest

HUB_USER = "system:serviceaccount:jhub:gpu-offload-hub"
USER_LABEL = "gpu-offload.io/user-namespace"


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({key: celpy.json_to_cel(value) for key, value in activation.items()})


def _is_true(result: Any) -> bool:
    """CEL true; an evaluation error (cel-python returns it as a value) or a non-boolean is not."""
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def admit(
    policy: dict[str, Any], request: dict[str, Any], obj: dict[str, Any], namespace: Any
) -> tuple[bool, str]:
    """(allowed, message) for one request under the rendered policy."""
    activation = {"request": request, "object": obj, "namespaceObject": namespace}
    spec = policy["spec"]
    if not all(_is_true(_evaluate(c["expression"], activation)) for c in spec["matchConditions"]):
        return True, "not judged: another requester"
    for validation in spec["validations"]:
        if not _is_true(_evaluate(validation["expression"], activation)):
            message = validation.get("message") or str(_evaluate(validation["messageExpression"], activation))
            return False, message
    return True, ""


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def create(resource: str, obj: dict[str, Any], user: str = HUB_USER) -> dict[str, Any]:
    group = "" if resource == "namespaces" else "rbac.authorization.k8s.io"
    return {
        "operation": "CREATE",
        "userInfo": {"username": user},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": obj["metadata"].get("namespace", ""),
        "name": obj["metadata"]["name"],
    }


ALICE = namespace("jhub-alice", {USER_LABEL: "true", "hub.jupyter.org/network-access-hub": "true"})


@pytest.fixture(scope="module")
def policy(kit: Any) -> dict[str, Any]:
    return kit.find(kit.render(), "ValidatingAdmissionPolicy", "gpu-offload-hub-user-namespaces")


@pytest.fixture(scope="module")
def hook_bindings(kit: Any) -> list[dict[str, Any]]:
    return kit.hook_bindings(kit.config_of(kit.render()), "jhub-alice")


def test_the_hub_may_create_a_labelled_user_namespace(policy: dict[str, Any]) -> None:
    assert admit(policy, create("namespaces", ALICE), ALICE, None) == (True, "")


@pytest.mark.parametrize(
    "ns",
    [
        namespace("jhub-alice"),
        namespace("jhub-alice", {USER_LABEL: "false"}),
        namespace("kube-alice", {USER_LABEL: "true"}),
    ],
    ids=["no label", "label false", "wrong prefix"],
)
def test_the_hub_may_not_create_any_other_namespace(policy: dict[str, Any], ns: dict[str, Any]) -> None:
    allowed, message = admit(policy, create("namespaces", ns), ns, None)
    assert not allowed
    assert USER_LABEL in message and "jhub-<user>" in message and ns["metadata"]["name"] in message


def test_other_requesters_are_not_judged(policy: dict[str, Any]) -> None:
    ns = namespace("team-x")
    assert admit(policy, create("namespaces", ns, user="kubernetes-admin"), ns, None)[0]


def test_the_spawner_hooks_bindings_are_admitted_in_a_user_namespace(
    policy: dict[str, Any], hook_bindings: list[dict[str, Any]]
) -> None:
    for binding in hook_bindings:
        assert admit(policy, create("rolebindings", binding), binding, ALICE) == (True, ""), binding


def test_the_same_bindings_are_denied_outside_user_namespaces(
    policy: dict[str, Any], hook_bindings: list[dict[str, Any]]
) -> None:
    for target in (
        namespace("kube-system"),
        namespace("jhub-alice-but-unlabelled"),
        namespace("other", {USER_LABEL: "true"}),
    ):
        for binding in hook_bindings:
            moved = {**binding, "metadata": {**binding["metadata"], "namespace": target["metadata"]["name"]}}
            allowed, message = admit(policy, create("rolebindings", moved), moved, target)
            assert not allowed, target
            assert target["metadata"]["name"] in message


@pytest.mark.parametrize(
    "role, subject",
    [
        (
            "gpu-offload-user-server",
            {"kind": "ServiceAccount", "name": "gpu-offload-user-server", "namespace": "jhub-bob"},
        ),
        (
            "gpu-offload-user-server",
            {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"},
        ),
        ("gpu-offload-user-server", {"kind": "ServiceAccount", "name": "default", "namespace": "jhub-alice"}),
        (
            "gpu-offload-user-namespace",
            {"kind": "ServiceAccount", "name": "gpu-offload-user-server", "namespace": "jhub-alice"},
        ),
        (
            "gpu-offload-user-namespace",
            {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"},
        ),
    ],
    ids=[
        "server role to another namespace",
        "to every user",
        "to the default account",
        "hub role to the server",
        "to a user",
    ],
)
def test_bindings_to_anyone_else_are_denied(
    policy: dict[str, Any], role: str, subject: dict[str, str]
) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "sneaky", "namespace": "jhub-alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    }
    allowed, message = admit(policy, create("rolebindings", binding), binding, ALICE)
    assert not allowed
    assert "users' server account of the same namespace" in message


def test_a_custom_prefix_reaches_the_policy(kit: Any) -> None:
    custom = kit.find(
        kit.render({"userNamespaces": {"prefix": "lab-"}}),
        "ValidatingAdmissionPolicy",
        "gpu-offload-hub-user-namespaces",
    )
    lab = namespace("lab-alice", {USER_LABEL: "true"})
    assert admit(custom, create("namespaces", lab), lab, None)[0]
    assert not admit(custom, create("namespaces", ALICE), ALICE, None)[0]
