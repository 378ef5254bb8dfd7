"""The Liqo tenant Role grants exactly the verbs the hub's code uses on Liqo objects in tenant namespaces.

The verbs are collected from the code itself (an AST scan of every ``hub_extension`` module for
``CustomObjectsApi`` calls on namespaced custom objects), so a new call without its verb in the chart, or a
verb the chart keeps after the code stopped using it, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from gpu_offload.liqo_peering import labels as L

HUB_CODE = Path(__file__).resolve().parents[2] / "hub_extension"
# CustomObjectsApi method prefix -> the RBAC verb the API server checks
VERBS = {"get": "get", "list": "list", "create": "create", "patch": "patch", "replace": "update", "delete": "delete"}
GVKS = {name: value for name, value in vars(L).items() if isinstance(value, L.GVK)}


def _bound_gvks(function: ast.AST) -> dict[str, L.GVK]:
    """Local names assigned from ``L.<GVK constant>`` in one function (``g = L.RESOURCE_SLICE``)."""
    bound = {}
    for node in ast.walk(function):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Attribute) and node.value.attr in GVKS):
            bound[node.targets[0].id] = GVKS[node.value.attr]
    return bound


def namespaced_calls(source: str, where: str) -> set[tuple[str, str, str]]:
    """(group, plural, verb) of every ``<verb>_namespaced_custom_object`` call; unresolvable ones fail."""
    found = set()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound = _bound_gvks(function)
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.endswith("_namespaced_custom_object")):
                continue
            verb = VERBS[node.func.attr.split("_", 1)[0]]
            first = node.args[0] if node.args else None
            assert (isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name)
                    and first.value.id in bound), (
                f"{where}:{node.lineno}: a custom-object call whose kind this check cannot see; pass "
                "g.group, g.version, namespace, g.plural with g = L.<GVK> assigned in the same function")
            gvk = bound[first.value.id]
            found.add((gvk.group, gvk.plural, verb))
    return found


def test_the_scan_sees_a_call_and_refuses_one_it_cannot_resolve() -> None:
    code = ("def f(custom, ns):\n    g = L.VIRTUAL_NODE\n"
            "    custom.replace_namespaced_custom_object(g.group, g.version, ns, g.plural, 'n', {})\n")
    assert namespaced_calls(code, "x") == {("offloading.liqo.io", "virtualnodes", "update")}
    hidden = "def f(custom, ns, kind):\n    custom.delete_namespaced_custom_object(kind.group, 'v', ns, 'p', 'n')\n"
    try:
        namespaced_calls(hidden, "x")
    except AssertionError as exc:
        assert "cannot see" in str(exc)
    else:
        raise AssertionError("an unresolvable call went unnoticed")


def test_the_tenant_role_grants_exactly_the_verbs_the_hub_uses(kit: Any) -> None:
    used: set[tuple[str, str, str]] = set()
    for path in sorted(HUB_CODE.rglob("*.py")):
        used |= namespaced_calls(path.read_text(), path.name)
    tenant_kinds = {(L.RESOURCE_SLICE.group, L.RESOURCE_SLICE.plural), (L.VIRTUAL_NODE.group, L.VIRTUAL_NODE.plural)}
    wanted = {(group, plural, verb) for group, plural, verb in used if (group, plural) in tenant_kinds}
    role = kit.find(kit.render(kit.two_tenants), "Role", "gpu-offload-liqo-tenant", "liqo-tenant-alpha")
    granted = {(group, plural, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for plural in rule["resources"] for verb in rule["verbs"]}
    assert granted == wanted, (f"granted but unused: {sorted(granted - wanted)}; "
                               f"used but not granted: {sorted(wanted - granted)}")


def test_with_queueing_on_the_hub_may_do_exactly_what_the_queue_reconcile_and_page_do(kit: Any) -> None:
    from gpu_offload.hub_extension.service.watches import QUEUE_PAGE_KINDS
    from gpu_offload.liqo_peering.queue_sync import WRITES

    # LocalQueues live in user namespaces: the spawner hook makes them there, under the per-namespace role
    cluster_kinds = {g.kind: g.plural for g in (L.RESOURCE_FLAVOR, L.CLUSTER_QUEUE, L.WORKLOAD_PRIORITY_CLASS)}
    wanted = {(cluster_kinds[kind], verb) for verb, kind in WRITES if kind in cluster_kinds}
    wanted |= {(plural, "list") for plural in cluster_kinds.values()}
    wanted |= {(g.plural, verb) for g in QUEUE_PAGE_KINDS for verb in ("list", "watch")}  # the Queues page
    objects = kit.render({"queueing": {"kueue": {"enabled": True}}})
    role = kit.find(objects, "ClusterRole", "gpu-offload-hub-kueue")
    granted = {(plural, verb) for rule in role["rules"] for group in rule["apiGroups"] if group == L.KUEUE_GROUP
               for plural in rule["resources"] for verb in rule["verbs"]}
    assert granted == wanted, (f"granted but unused: {sorted(granted - wanted)}; "
                               f"used but not granted: {sorted(wanted - granted)}")
    namespace_role = kit.find(objects, "ClusterRole", "gpu-offload-user-namespace")
    assert {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["create"]} in namespace_role["rules"]
    # the priority classes each user may use: created at the first spawn, replaced (update) at the next ones
    assert {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]} in namespace_role["rules"]
    server_role = kit.find(objects, "ClusterRole", "gpu-offload-user-server")
    assert not any("configmaps" in r["resources"] for r in server_role["rules"])  # a user cannot widen their own
    off = kit.render()
    assert not [o for o in off if o["metadata"]["name"] == "gpu-offload-hub-kueue"]
    assert not any("kueue.x-k8s.io" in r["apiGroups"]
                   for r in kit.find(off, "ClusterRole", "gpu-offload-user-namespace")["rules"])


def test_with_queueing_on_a_users_kernel_may_read_its_place_in_line_and_nothing_more(kit: Any) -> None:
    from gpu_offload.liqo_peering.queue_client import KueueClient

    objects = kit.render({"queueing": {"kueue": {"enabled": True, "clusterQueue": "pool"}}})
    server = kit.find(objects, "ClusterRole", "gpu-offload-user-server")
    kueue_rules = [r for r in server["rules"] if any("kueue" in g for g in r["apiGroups"])]
    assert kueue_rules == [
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get", "list"]},
        {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"], "verbs": ["get"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]},
    ]
    # the calls a kernel makes are those: its LocalQueue, the namespace's LocalQueues when GPU_OFFLOAD_QUEUE is
    # unset, the visibility API, the namespace's Workloads (Kueue's reason) and the ClusterQueue's list/watch
    assert {"local_queue", "local_queue_names", "pending_workloads", "workloads", "cluster_queue"} <= set(
        vars(KueueClient))
    viewer = kit.find(objects, "ClusterRole", "gpu-offload-queue-viewer")
    assert viewer["rules"] == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"],
                                "resourceNames": ["pool"], "verbs": ["get", "list", "watch"]}]
    binding = kit.find(objects, "ClusterRoleBinding", "gpu-offload-queue-viewer")
    assert binding["subjects"] == [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                                    "name": "system:serviceaccounts"}]
    off = kit.render()
    assert not [o for o in off if o["metadata"]["name"] == "gpu-offload-queue-viewer"]
    assert not any("kueue" in g for r in kit.find(off, "ClusterRole", "gpu-offload-user-server")["rules"]
                   for g in r["apiGroups"])
