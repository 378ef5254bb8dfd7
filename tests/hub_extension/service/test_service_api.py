"""The service through a real JupyterHub: who may see and do what, actions validated, confirmed, audited."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.inventory import inventory_from_dict
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import offloaded_namespace

VN = ("offloading.liqo.io", "v1beta1")
RS = ("authentication.liqo.io", "v1beta1")
REMOTE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: donor-3, cluster: {server: "https://donor-3.invalid:6443"}}]
users: [{name: admin, user: {token: not-a-real-token}}]
contexts: [{name: donor-3, context: {cluster: donor-3, user: admin}}]
current-context: donor-3
"""


@pytest.fixture(scope="module")
def custom(origin: RunningOrigin) -> Iterator[kubernetes.client.CustomObjectsApi]:
    client = origin.sandbox.api_client()
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


def _rows(hub: Any) -> dict[str, dict[str, Any]]:
    answer = hub.api("GET", "api/admin/clusters", "admin")
    assert answer.status == 200, answer.text
    return {r["cluster_id"]: r for r in answer.json()["clusters"]}


def test_admin_sees_both_donors_with_their_gpus(hub: Any) -> None:
    rows = _rows(hub)
    assert set(rows) == {"donor-1", "donor-2"}
    assert all(r["gpus_total"] == 4 and r["gpus_free"] == 4 and r["health"] == "healthy" for r in rows.values())
    assert rows["donor-1"]["price"] == 2.0 and rows["donor-2"]["price"] == 2.25
    assert dict(map(tuple, rows["donor-1"]["modules"])) == {"networking": "ok", "authentication": "ok", "offloading": "ok"}
    page = hub.api("GET", "", "admin")
    assert page.status == 200 and "donor-1" in page.text and "donor-2" in page.text
    detail = hub.api("GET", "api/admin/clusters/donor-2", "admin").json()
    assert [vn["name"] for vn in detail["virtual_nodes"]] == ["donor-2-gpu"]
    assert [(s["name"], s["granted_gpus"]) for s in detail["slices"]] == [("donor-2-gpu", "4")]


def test_the_clusters_page_shows_the_trust_the_origin_configured(hub: Any) -> None:
    # the hub's configuration trusts donor-2 only (conftest); the donors' own labels play no part
    rows = _rows(hub)
    assert (rows["donor-1"]["trusted"], rows["donor-2"]["trusted"]) == (False, True)
    page = hub.api("GET", "", "admin").text
    cells = [row for row in page.split("<tr>") if "clusters/donor-" in row]
    assert len(cells) == 2
    by_cluster = {("donor-1" if "clusters/donor-1" in row else "donor-2"): row for row in cells}
    assert ">trusted<" in by_cluster["donor-2"] and "untrusted" not in by_cluster["donor-2"]
    assert "untrusted: outputs come back as plain data only" in by_cluster["donor-1"]


def test_a_plain_user_gets_403_on_admin_pages_but_reads_the_inventory(hub: Any) -> None:
    for path in ("", "users", "audit", "api/admin/clusters", "api/admin/audit"):
        assert hub.api("GET", path, "alice").status == 403, path
    assert hub.api("POST", "api/admin/actions/cordon", "alice",
                   {"cluster_id": "donor-1", "node": "donor-1-gpu", "confirm": True}).status == 403
    inventory = hub.api("GET", "api/inventory", "alice")
    assert inventory.status == 200
    body = inventory.json()
    assert body["free_gpus_by_model"] == {"A100": 8}
    assert body["price_per_gpu_hour_by_model"] == {"A100": 2.0}
    # the records rebuild the inventory in the kernel, where placement runs the same code
    records = inventory_from_dict(body["records"])
    assert place(records, PlacementRequest(gpus=4)).virtual_node == "donor-1-gpu"  # most free, then cheapest
    # ...and carry the trust the chart's clusters value gives, which the kernel acts on
    assert {c.cluster_id: c.trusted for c in records.clusters} == {"donor-1": False, "donor-2": True}
    mine = hub.api("GET", "api/me", "alice").json()
    assert mine["user"] == "alice" and mine["running"] == [] and mine["finished"] == []


def test_a_viewer_reads_the_admin_pages_but_may_not_change_anything(hub: Any) -> None:
    assert hub.api("GET", "api/admin/clusters", "vera").status == 200
    assert hub.api("GET", "users", "vera").status == 200
    refused = hub.api("POST", "api/admin/actions/cordon", "vera",
                      {"cluster_id": "donor-1", "node": "donor-1-gpu", "confirm": True})
    assert refused.status == 403 and "custom:gpu-offload:manage" in refused.json()["error"]
    assert "gpu-offload-operator role" in refused.json()["error"]


def test_cordon_needs_confirmation_is_audited_and_placement_avoids_the_node(hub: Any, origin: RunningOrigin,
                                                                           custom: Any) -> None:
    target = {"cluster_id": "donor-1", "node": "donor-1-gpu"}
    unconfirmed = hub.api("POST", "api/admin/actions/cordon", "admin", target)
    assert unconfirmed.status == 400 and "cordon virtual node donor-1-gpu" in unconfirmed.json()["error"]
    vnode = custom.get_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", "donor-1-gpu")
    assert "gpu-offload.io/cordoned" not in vnode["spec"]["labels"]  # nothing happened unconfirmed
    try:
        done = hub.api("POST", "api/admin/actions/cordon", "admin", {**target, "confirm": True})
        assert done.status == 200 and done.json()["ok"], done.text
        vnode = custom.get_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", "donor-1-gpu")
        assert vnode["spec"]["labels"]["gpu-offload.io/cordoned"] == "true"
        wait_until(lambda: _rows(hub)["donor-1"]["cordoned"] == 1, "the service to see the cordon")
        inventory = LiqoClient(origin.sandbox.api_client()).read_inventory()
        for _ in range(5):
            assert place(inventory, PlacementRequest(gpus=1)).virtual_node == "donor-2-gpu"
        audit = hub.api("GET", "api/admin/audit", "admin").json()["audit"][0]
        assert (audit["who"], audit["action"], audit["ok"]) == ("admin", "cordon", True)
        assert "donor-1-gpu" in audit["target"] and "cordoned" in audit["result"]
    finally:
        back = hub.api("POST", "api/admin/actions/uncordon", "admin", {**target, "confirm": True})
    assert back.status == 200, back.text
    vnode = custom.get_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", "donor-1-gpu")
    assert "gpu-offload.io/cordoned" not in vnode["spec"]["labels"]
    wait_until(lambda: _rows(hub)["donor-1"]["cordoned"] == 0, "the service to see the uncordon")


@pytest.mark.parametrize(("kind", "body", "words"), [
    ("resourceslice", {"cluster_id": "donor-1", "gpus": "two"}, "whole number of GPUs"),
    ("resourceslice", {"cluster_id": "donor-1", "gpus": "2", "memory": "lots"}, "not a resource quantity"),
    ("resourceslice", {"cluster_id": "Donor_1", "gpus": "2"}, "not a DNS-1123 label"),
    ("cordon", {"cluster_id": "donor-1", "node": "Donor-1-GPU"}, "not a DNS-1123 name"),
    ("label", {"cluster_id": "donor-1", "node": "donor-1-gpu", "model": "A100", "price": "3 EUR"}, "decimal number"),
    ("label", {"cluster_id": "donor-1", "node": "donor-1-gpu", "model": "A 100", "price": "3"}, "not a label value"),
    ("explode", {"cluster_id": "donor-1"}, "unknown action"),
])
def test_bad_input_is_refused_in_words_and_nothing_is_written(hub: Any, custom: Any, kind: str,
                                                             body: dict[str, str], words: str) -> None:
    before = custom.list_cluster_custom_object(*RS, "resourceslices")["items"]
    answer = hub.api("POST", f"api/admin/actions/{kind}", "admin", {**body, "confirm": True})
    assert answer.status == 400, answer.text
    assert words in answer.json()["error"] and "Traceback" not in answer.text
    after = custom.list_cluster_custom_object(*RS, "resourceslices")["items"]
    assert [o["metadata"]["resourceVersion"] for o in after] == [o["metadata"]["resourceVersion"] for o in before]


def test_a_peer_outside_the_hubs_tenant_namespaces_is_refused_with_the_fix_and_audited(hub: Any) -> None:
    answer = hub.api("POST", "api/admin/actions/resourceslice", "admin",
                     {"cluster_id": "donor-9", "gpus": "2", "confirm": True})
    assert answer.status == 409
    assert "liqo-tenant-donor-9" in answer.json()["message"] and "liqo.tenantNamespaces" in answer.json()["message"]
    audit = hub.api("GET", "api/admin/audit", "admin").json()["audit"][0]
    assert (audit["action"], audit["ok"]) == ("resourceslice", False) and "donor-9" in audit["target"]


def test_gpus_are_asked_only_of_authenticated_peers(hub: Any) -> None:
    answer = hub.api("POST", "api/admin/actions/resourceslice", "admin",
                     {"cluster_id": "donor-3", "gpus": "2", "confirm": True})
    assert answer.status == 409 and "cluster donor-3 is not peered" in answer.json()["message"]


def test_resize_and_request_gpu_slices(hub: Any, custom: Any) -> None:
    resized = hub.api("POST", "api/admin/actions/resourceslice", "admin",
                      {"cluster_id": "donor-1", "gpus": "6", "confirm": True})
    assert resized.status == 200, resized.text
    try:
        wait_until(lambda: _rows(hub)["donor-1"]["gpus_total"] == 6, "donor-1's virtual node to follow the grant")
    finally:
        hub.api("POST", "api/admin/actions/resourceslice", "admin", {"cluster_id": "donor-1", "gpus": "4", "confirm": True})
    wait_until(lambda: _rows(hub)["donor-1"]["gpus_total"] == 4, "the size to come back")

    created = hub.api("POST", "api/admin/actions/resourceslice", "admin",
                      {"cluster_id": "donor-2", "gpus": "2", "name": "donor-2-extra", "confirm": True})
    try:
        assert created.status == 200 and "created" in created.json()["message"], created.text
        body = custom.get_namespaced_custom_object(*RS, "liqo-tenant-donor-2", "resourceslices", "donor-2-extra")
        assert body["spec"]["consumerClusterID"] == "origin" and body["spec"]["resources"] == {"nvidia.com/gpu": "2"}

        def granted() -> bool:
            slices = hub.api("GET", "api/admin/clusters/donor-2", "admin").json()["slices"]
            return ("donor-2-extra", "2") in [(s["name"], s["granted_gpus"]) for s in slices]

        wait_until(granted, "the new slice to be granted and shown")
        wait_until(lambda: _rows(hub)["donor-2"]["gpus_total"] == 6, "the new slice's GPUs counted for donor-2")
    finally:  # the origin is shared: the slice goes, and Liqo takes its virtual node and GPUs with it
        custom.delete_namespaced_custom_object(*RS, "liqo-tenant-donor-2", "resourceslices", "donor-2-extra")
    wait_until(lambda: _rows(hub)["donor-2"]["gpus_total"] == 4, "donor-2's GPUs back to its seeded slice")


def _donor_2_node(hub: Any) -> dict[str, Any]:
    answer = hub.api("GET", "api/admin/clusters/donor-2", "admin")
    assert answer.status == 200, answer.text
    (vn,) = [vn for vn in answer.json()["virtual_nodes"] if vn["name"] == "donor-2-gpu"]
    return dict(vn)


def _set_labels(hub: Any, model: str, price: str) -> Any:
    return hub.api("POST", "api/admin/actions/label", "admin",
                   {"cluster_id": "donor-2", "node": "donor-2-gpu", "model": model, "price": price, "confirm": True})


def test_set_model_and_price_labels(hub: Any, custom: Any) -> None:
    try:
        answer = _set_labels(hub, "H100", "3.5")
        assert answer.status == 200, answer.text
        vnode = custom.get_namespaced_custom_object(*VN, "liqo-tenant-donor-2", "virtualnodes", "donor-2-gpu")
        assert vnode["spec"]["labels"]["gpu-offload.io/gpu-model"] == "H100"
        assert vnode["spec"]["labels"]["gpu-offload.io/price-per-gpu-hour"] == "3.5"
        # Liqo carries the labels to the Node, whose labels the inventory prefers: the pages show them
        wait_until(lambda: (lambda vn: (vn["model"], vn["price"]) == ("H100", 3.5))(_donor_2_node(hub)),
                   "the service to show donor-2-gpu as H100 at 3.5")
        page = hub.api("GET", "clusters/donor-2", "admin")
        assert page.status == 200 and "H100" in page.text and "3.5" in page.text
        # what users see too (other slices of donor-2 an earlier test made keep their A100 labels)
        inventory = hub.api("GET", "api/inventory", "alice").json()
        assert inventory["price_per_gpu_hour_by_model"]["H100"] == 3.5
        assert inventory["free_gpus_by_model"]["H100"] == 4
        missing = hub.api("POST", "api/admin/actions/label", "admin",
                          {"cluster_id": "donor-2", "node": "donor-2-nope", "model": "H100", "price": "3",
                           "confirm": True})
        assert missing.status == 409 and "does not exist" in missing.json()["message"]
    finally:
        back = _set_labels(hub, "A100", "2.25")
    assert back.status == 200, back.text
    wait_until(lambda: (lambda vn: (vn["model"], vn["price"]) == ("A100", 2.25))(_donor_2_node(hub)),
               "donor-2-gpu to be A100 at 2.25 again")


def test_peering_is_not_run_when_disabled_and_the_exact_command_is_shown(hub: Any) -> None:
    answer = hub.api("POST", "api/admin/actions/peer", "admin", {"cluster_id": "donor-3", "confirm": True})
    assert answer.status == 409
    assert answer.json()["command"] == "liqoctl peer --remote-kubeconfig '<kubeconfig of cluster donor-3>'"
    assert "peering.liqoctlEnabled is false" in answer.json()["message"]
    assert not hub.liqoctl_log.exists()
    audit = hub.api("GET", "api/admin/audit", "admin").json()["audit"][0]
    assert (audit["action"], audit["ok"]) == ("peer", False)


def test_peering_runs_liqoctl_with_the_uploaded_kubeconfig_when_enabled(hub_factory: Any) -> None:
    hub = hub_factory(liqoctl_enabled=True)
    answer = hub.api("POST", "api/admin/actions/peer", "admin",
                     {"cluster_id": "donor-3", "kubeconfig": REMOTE_KUBECONFIG, "confirm": True})
    assert answer.status == 200 and answer.json()["ok"], answer.text
    assert "peering established (stand-in)" in answer.json()["message"]
    (call,) = [json.loads(line) for line in hub.liqoctl_log.read_text().splitlines()]
    assert call["args"][:2] == ["peer", "--remote-kubeconfig"] and call["kubeconfig"] == REMOTE_KUBECONFIG
    assert not Path(call["args"][2]).exists()  # the credentials did not outlive the run
    unpeer = hub.api("POST", "api/admin/actions/unpeer", "admin", {"cluster_id": "donor-3", "confirm": True})
    assert unpeer.status == 409 and "upload the remote cluster's kubeconfig" in unpeer.json()["message"]
    bad = hub.api("POST", "api/admin/actions/peer", "admin",
                  {"cluster_id": "donor-3", "kubeconfig": "hello", "confirm": True})
    assert bad.status == 400 and "not a kubeconfig" in bad.json()["error"]
    assert len(hub.liqoctl_log.read_text().splitlines()) == 1  # neither refused request ran liqoctl


HOSTILE = '<script>alert("owned")</script>'


def _escaped(page: Any) -> bool:
    return "<script>alert" not in page.text and "&lt;script&gt;alert(" in page.text


def test_hostile_values_are_escaped_on_every_page(hub: Any, origin: RunningOrigin) -> None:
    """A user name from a pod's annotation, values in the usage and audit records, a URL and a form value."""
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    try:
        pod = {"metadata": {"name": "gpuo-hostile", "labels": {"gpu-offload.io/managed-by": "gpu-offload",
                                                               "gpu-offload.io/user": "mallory"},
                            "annotations": {"gpu-offload.io/user": HOSTILE}},
               "spec": {"restartPolicy": "Never", "containers": [{
                   "name": "runner", "image": "python:3.11", "command": ["python3", "-c", "pass"],
                   "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        core.create_namespaced_pod(ns, pod)
        wait_until(lambda: "&lt;script&gt;" in hub.api("GET", "users", "admin").text, "the hostile run to be metered")
        node = wait_until(lambda: core.read_namespaced_pod("gpuo-hostile", ns).spec.node_name, "the pod's node")
        cluster = "donor-1" if node.startswith("donor-1") else "donor-2"
        # what a hub whose user names allow anything would record (the test hub's allowed users are plain)
        store = Store(f"sqlite:///{hub.workdir}/usage.sqlite")
        store.audit(HOSTILE, "cordon", f"cluster {HOSTILE}", f"failed: {HOSTILE}", False)
        store.close()
        pages = {
            "users": hub.api("GET", "users", "admin"),
            "cluster": hub.api("GET", f"clusters/{cluster}", "admin"),
            "audit": hub.api("GET", "audit", "admin"),
            "404": hub.api("GET", f"clusters/{quote(HOSTILE, safe='')}", "admin"),
            "400": hub.api("POST", "actions/cordon", "admin", form={"cluster_id": HOSTILE, "node": "n"}),
        }
        assert (pages["404"].status, pages["400"].status) == (404, 400)
        for name, page in pages.items():
            assert _escaped(page), (name, page.text)
    finally:
        core.delete_namespace(ns)
        client.close()
