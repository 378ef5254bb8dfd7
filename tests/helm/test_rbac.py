"""Least privilege: what each account may do once the chart is installed and the spawner hook has set up a
user namespace, evaluated with Kubernetes RBAC's rules over the rendered objects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "bind", "escalate", "impersonate"}
KNOWN_VERBS = {"get", "list", "watch"} | WRITE_VERBS
BROAD_ROLES = {"cluster-admin", "admin", "edit"}


@dataclass(frozen=True)
class Request:
    """One API request, as the RBAC authorizer sees it."""

    verb: str
    group: str
    resource: str
    namespace: str | None = None
    name: str | None = None


def _rule_allows(rule: dict[str, Any], request: Request) -> bool:
    names = rule.get("resourceNames")
    return (
        request.verb in rule["verbs"]
        and request.group in rule["apiGroups"]
        and request.resource in rule["resources"]
        # a rule limited to names never matches a request without one (create, list, watch)
        and (not names or request.name in names)
    )


def allowed(objects: list[dict[str, Any]], account: tuple[str, str], request: Request) -> bool:
    """Whether any binding of the service account grants the request (RBAC is purely additive)."""
    subject = {"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    for binding in objects:
        if binding["kind"] not in {"ClusterRoleBinding", "RoleBinding"} or subject not in binding["subjects"]:
            continue
        scope = binding["metadata"].get("namespace")  # None: a ClusterRoleBinding, everywhere
        if scope is not None and request.namespace != scope:
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"]))
        if role and any(_rule_allows(rule, request) for rule in role["rules"]):
            return True
    return False


@pytest.fixture(scope="module")
def installed(kit: Any) -> list[dict[str, Any]]:
    """The chart with two tenants, plus the hook's bindings in user namespace jhub-alice."""
    objects = kit.render(kit.two_tenants)
    return objects + kit.hook_bindings(kit.config_of(objects), "jhub-alice")


HUB = ("jhub", "hub")  # zero-to-jupyterhub's hub account
ALICE_SERVER = ("jhub-alice", "gpu-offload-user-server")
LIQO_OFFLOADING = "offloading.liqo.io"

CASES = [
    # the hub reads the inventory cluster-wide
    (HUB, Request("list", "core.liqo.io", "foreignclusters"), True),
    (HUB, Request("watch", LIQO_OFFLOADING, "virtualnodes", "liqo-tenant-alpha"), True),
    (HUB, Request("list", "authentication.liqo.io", "resourceslices", "liqo-tenant-gamma"), True),
    (HUB, Request("watch", "", "pods", "jhub-bob"), True),
    # ...and releases its metering finalizer from runner pods in user namespaces the hook bound it in
    (HUB, Request("patch", "", "pods", "jhub-alice", "gpuo-run-1"), True),
    (HUB, Request("patch", "", "pods", "jhub-bob", "gpuo-run-1"), False),
    # ...and keeps the user's GPU quota there; the user's own server may not change it
    (HUB, Request("patch", "", "resourcequotas", "jhub-alice", "gpu-offload"), True),
    (ALICE_SERVER, Request("patch", "", "resourcequotas", "jhub-alice", "gpu-offload"), False),
    (ALICE_SERVER, Request("delete", "", "resourcequotas", "jhub-alice", "gpu-offload"), False),
    (HUB, Request("list", "", "nodes"), True),
    # ...and writes ResourceSlices and VirtualNode labels only in the listed tenant namespaces
    (HUB, Request("create", "authentication.liqo.io", "resourceslices", "liqo-tenant-alpha"), True),
    (HUB, Request("patch", "authentication.liqo.io", "resourceslices", "liqo-tenant-beta", "gpu"), True),
    (HUB, Request("create", "authentication.liqo.io", "resourceslices", "liqo-tenant-gamma"), False),
    (HUB, Request("create", "authentication.liqo.io", "resourceslices", "jhub-alice"), False),
    (HUB, Request("patch", LIQO_OFFLOADING, "virtualnodes", "liqo-tenant-alpha", "gpu-a100"), True),
    (HUB, Request("patch", "", "nodes", None, "gpu-a100"), False),
    (HUB, Request("delete", "core.liqo.io", "foreignclusters", None, "alpha"), False),
    # NamespaceOffloading only in a user namespace the hook has set up
    (HUB, Request("create", LIQO_OFFLOADING, "namespaceoffloadings", "jhub-alice"), True),
    (HUB, Request("create", LIQO_OFFLOADING, "namespaceoffloadings", "jhub-bob"), False),
    (HUB, Request("create", LIQO_OFFLOADING, "namespaceoffloadings", "kube-system"), False),
    # secrets: never cluster-wide
    (HUB, Request("get", "", "secrets", "kube-system", "any"), False),
    (HUB, Request("list", "", "secrets", "jhub-bob"), False),
    # creating namespaces and RoleBindings is cluster-wide (RBAC cannot do better; admission narrows it)
    (HUB, Request("create", "", "namespaces"), True),
    (HUB, Request("delete", "", "namespaces", None, "kube-system"), False),
    (HUB, Request("patch", "", "namespaces", None, "kube-system"), False),
    (HUB, Request("create", "rbac.authorization.k8s.io", "rolebindings", "jhub-bob"), True),
    (
        HUB,
        Request("bind", "rbac.authorization.k8s.io", "clusterroles", None, "gpu-offload-user-server"),
        True,
    ),
    (HUB, Request("bind", "rbac.authorization.k8s.io", "clusterroles", None, "cluster-admin"), False),
    (
        HUB,
        Request("escalate", "rbac.authorization.k8s.io", "clusterroles", None, "gpu-offload-user-server"),
        False,
    ),
    (HUB, Request("create", "rbac.authorization.k8s.io", "clusterrolebindings"), False),
    (HUB, Request("impersonate", "", "serviceaccounts", "jhub-alice", "gpu-offload-user-server"), False),
    # the user's server: pods and secrets in its own namespace, nothing else
    (ALICE_SERVER, Request("create", "", "pods", "jhub-alice"), True),
    (ALICE_SERVER, Request("get", "", "pods/log", "jhub-alice", "run-1"), True),
    (ALICE_SERVER, Request("delete", "", "pods", "jhub-alice", "run-1"), True),
    (ALICE_SERVER, Request("create", "", "secrets", "jhub-alice"), True),
    (ALICE_SERVER, Request("list", "", "secrets", "jhub-alice"), True),  # cleanup of a crashed kernel's
    (ALICE_SERVER, Request("create", "", "pods/attach", "jhub-alice", "session-1"), True),  # warm sessions
    (ALICE_SERVER, Request("get", LIQO_OFFLOADING, "namespaceoffloadings", "jhub-alice", "offloading"), True),
    # distributed runs: a Job and the headless Service of rank 0, in its own namespace only
    (ALICE_SERVER, Request("create", "batch", "jobs", "jhub-alice"), True),
    (ALICE_SERVER, Request("delete", "batch", "jobs", "jhub-alice", "gpuo-run-1"), True),
    (ALICE_SERVER, Request("create", "", "services", "jhub-alice"), True),
    (ALICE_SERVER, Request("patch", "", "services", "jhub-alice", "gpuo-run-1-rank0"), False),
    (ALICE_SERVER, Request("create", "batch", "jobs", "jhub-bob"), False),
    (ALICE_SERVER, Request("create", "batch", "cronjobs", "jhub-alice"), False),

    # why Kueue stopped a pod it deleted (its "Stopped" event): read, never written
    (ALICE_SERVER, Request("list", "", "events", "jhub-alice"), True),
    (ALICE_SERVER, Request("create", "", "events", "jhub-alice"), False),
    (ALICE_SERVER, Request("list", "", "events", "jhub-bob"), False),
    (ALICE_SERVER, Request("list", "", "secrets", "jhub-bob"), False),
    (ALICE_SERVER, Request("create", "", "pods", "jhub-bob"), False),
    (ALICE_SERVER, Request("get", "", "secrets", "jhub-bob", "run-1"), False),
    (ALICE_SERVER, Request("create", "apps", "deployments", "jhub-alice"), False),
    (ALICE_SERVER, Request("create", "", "pods/exec", "jhub-alice", "run-1"), False),
    (ALICE_SERVER, Request("create", LIQO_OFFLOADING, "namespaceoffloadings", "jhub-alice"), False),
    (ALICE_SERVER, Request("create", "rbac.authorization.k8s.io", "rolebindings", "jhub-alice"), False),
    (ALICE_SERVER, Request("list", "core.liqo.io", "foreignclusters"), False),
    # another user's server account gets nothing until the hook runs for that user
    (("jhub-bob", "gpu-offload-user-server"), Request("create", "", "pods", "jhub-bob"), False),
]


@pytest.mark.parametrize("account, request_, expected", CASES, ids=lambda v: getattr(v, "resource", None))
def test_effective_permissions(
    installed: list[dict[str, Any]], account: Any, request_: Request, expected: bool
) -> None:
    assert allowed(installed, account, request_) is expected, (account, request_)


def _rules(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, r) for o in objects if o["kind"] in {"Role", "ClusterRole"} for r in o["rules"]]


def test_no_wildcards_and_only_known_verbs(kit: Any) -> None:
    for role, rule in _rules(kit.render(kit.two_tenants)):
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
        assert set(rule["verbs"]) <= KNOWN_VERBS, (role["metadata"]["name"], rule)
        assert "nonResourceURLs" not in rule
        assert not {"escalate", "impersonate"} & set(rule["verbs"])


def test_no_binding_to_a_broad_or_system_role(kit: Any) -> None:
    for values in ({}, kit.two_tenants, {"jupyterhub": {"hub": {"serviceAccount": {"name": "jupyterhub"}}}}):
        for obj in kit.render(values):
            if obj["kind"].endswith("Binding") and "roleRef" in obj:
                name = obj["roleRef"]["name"]
                assert name not in BROAD_ROLES and not name.startswith("system:"), obj["metadata"]["name"]


def test_cluster_wide_writes_are_exactly_the_three_that_rbac_cannot_scope(kit: Any) -> None:
    objects = kit.render(kit.two_tenants)
    bound_cluster_wide = {o["roleRef"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"}
    writes = set()
    for role, rule in _rules(objects):
        if role["kind"] == "ClusterRole" and role["metadata"]["name"] in bound_cluster_wide:
            for verb in set(rule["verbs"]) & WRITE_VERBS:
                writes |= {
                    (resource, verb, tuple(rule.get("resourceNames", []))) for resource in rule["resources"]
                }
    assert writes == {
        ("namespaces", "create", ()),
        ("rolebindings", "create", ()),
        ("clusterroles", "bind", ("gpu-offload-user-namespace", "gpu-offload-user-server")),
    }


def test_per_namespace_cluster_roles_are_never_bound_cluster_wide(kit: Any) -> None:
    objects = kit.render(kit.two_tenants)
    config = kit.config_of(objects)["userNamespaces"]
    bound_cluster_wide = {o["roleRef"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"}
    assert not {config["hubClusterRole"], config["userServerClusterRole"]} & bound_cluster_wide


def _crd_names(shared: Path) -> dict[tuple[str, str], str]:
    """(group, plural) -> scope of every Liqo CRD in ../shared/liqo-crds."""
    found = {}
    for path in sorted((shared / "liqo-crds").glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        found[(crd["spec"]["group"], crd["spec"]["names"]["plural"])] = crd["spec"]["scope"]
    return found


def test_liqo_rules_name_resources_that_liqo_defines(kit: Any) -> None:
    crds = _crd_names(kit.shared)
    liqo_rules = [
        (role, rule)
        for role, rule in _rules(kit.render(kit.two_tenants))
        if "liqo.io" in rule["apiGroups"][0]
    ]
    assert len(liqo_rules) >= 5
    for role, rule in liqo_rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) in crds, (
                    f"{role['metadata']['name']}: {group}/{resource} is no Liqo CRD"
                )
                if role["kind"] == "Role":  # a Role can only grant namespaced resources
                    assert crds[(group, resource)] == "Namespaced"


def test_a_users_server_may_list_localqueues_of_its_own_namespace_only_when_queueing_is_on(kit: Any) -> None:
    # the kernel finds its queue by listing its namespace's LocalQueues when GPU_OFFLOAD_QUEUE is unset; with
    # queueing off the list is refused and the kernel runs without queueing, as before
    listing = Request("list", "kueue.x-k8s.io", "localqueues", "jhub-alice")
    for enabled in (True, False):
        objects = kit.render({**kit.two_tenants, "queueing": {"kueue": {"enabled": enabled}}})
        objects += kit.hook_bindings(kit.config_of(objects), "jhub-alice")
        assert allowed(objects, ALICE_SERVER, listing) is enabled
        assert not allowed(objects, ALICE_SERVER, Request("list", "kueue.x-k8s.io", "localqueues", "jhub-bob"))
        assert not allowed(objects, ALICE_SERVER, Request("create", "kueue.x-k8s.io", "localqueues", "jhub-alice"))


def test_a_users_server_may_read_the_workloads_of_its_own_namespace_only_and_never_write_them(kit: Any) -> None:
    # Kueue's reason for a wait is in the Workload's status: read in the user's namespace with queueing on,
    # nowhere else, and never written (a user who could edit a Workload or its status could change its
    # priority or admission)
    for enabled in (True, False):
        objects = kit.render({**kit.two_tenants, "queueing": {"kueue": {"enabled": enabled}}})
        objects += kit.hook_bindings(kit.config_of(objects), "jhub-alice")
        for verb in ("get", "list", "watch"):
            assert allowed(objects, ALICE_SERVER, Request(verb, "kueue.x-k8s.io", "workloads", "jhub-alice",
                                                           None if verb != "get" else "pod-run-1")) is enabled
            assert not allowed(objects, ALICE_SERVER, Request(verb, "kueue.x-k8s.io", "workloads", "jhub-bob"))
            assert not allowed(objects, ALICE_SERVER, Request(verb, "kueue.x-k8s.io", "workloads", None))
        for verb in ("create", "update", "patch", "delete", "deletecollection"):
            assert not allowed(objects, ALICE_SERVER, Request(verb, "kueue.x-k8s.io", "workloads", "jhub-alice"))
            assert not allowed(objects, ALICE_SERVER, Request(verb, "kueue.x-k8s.io", "workloads/status",
                                                               "jhub-alice"))
