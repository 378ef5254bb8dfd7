"""Admin actions are validated before anything is sent, and described in words; pages escape everything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig, load_config
from gpu_offload.hub_extension.service import pages
from gpu_offload.hub_extension.service.actions import Cordon, NodeLabels, Peering, SliceRequest, parse_action
from gpu_offload.hub_extension.service.liqoctl import shown_command
from gpu_offload.hub_extension.service.operations import ClusterFacts, Operations
from gpu_offload.hub_extension.service.views import ClusterPageRow
from gpu_offload.liqo_peering.errors import InvalidRequest


def test_forms_become_typed_actions_with_defaults() -> None:
    assert parse_action("resourceslice", {"cluster_id": "donor-1", "gpus": " 4 ", "memory": "64Gi"}) == SliceRequest(
        "donor-1", 4, "donor-1-gpu", None, "64Gi")
    assert parse_action("label", {"cluster_id": "d", "node": "d-gpu", "model": "A100-80GB", "price": "2.5"}) == NodeLabels(
        "d", "d-gpu", "A100-80GB", "2.5")
    assert parse_action("uncordon", {"cluster_id": "d", "node": "d-gpu"}) == Cordon("d", "d-gpu", False)
    assert parse_action("unpeer", {"cluster_id": "d"}) == Peering("d", False, "")


def test_patches_touch_only_what_the_action_names() -> None:
    assert SliceRequest("d", 6, "d-gpu").resize_patch() == {"spec": {"resources": {"nvidia.com/gpu": "6"}}}
    assert Cordon("d", "n", True).patch() == {"spec": {"labels": {"gpu-offload.io/cordoned": "true"}}}
    assert Cordon("d", "n", False).patch() == {"spec": {"labels": {"gpu-offload.io/cordoned": None}}}
    assert NodeLabels("d", "n", "L4", "0.8").patch() == {"spec": {"labels": {
        "gpu-offload.io/gpu-model": "L4", "gpu-offload.io/price-per-gpu-hour": "0.8"}}}


@pytest.mark.parametrize(("kind", "form", "words"), [
    ("resourceslice", {"gpus": "1"}, "'cluster_id' is missing"),
    ("resourceslice", {"cluster_id": "d", "gpus": "0"}, "from 1 to 1024"),
    ("resourceslice", {"cluster_id": "d", "gpus": "1.5"}, "whole number"),
    ("resourceslice", {"cluster_id": "d", "gpus": "2", "cpu": "-1"}, "more than zero"),
    ("resourceslice", {"cluster_id": "d", "gpus": "2", "name": "Slice!"}, "not a DNS-1123 name"),
    ("resourceslice", {"cluster_id": "x" * 64, "gpus": "2"}, "at most 63"),
    ("label", {"cluster_id": "d", "node": "n", "model": "A100", "price": "-2"}, "decimal number"),
    ("label", {"cluster_id": "d", "node": "n", "model": "-A100", "price": "2"}, "not a label value"),
    ("peer", {"cluster_id": "d", "kubeconfig": "just text"}, "not a kubeconfig"),
])
def test_bad_fields_are_named_with_what_would_be_accepted(kind: str, form: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_action(kind, form)
    assert words in str(raised.value)


def test_the_shown_peering_command_is_exact() -> None:
    assert shown_command(Peering("donor-3", True, "")) == (
        "liqoctl peer --remote-kubeconfig '<kubeconfig of cluster donor-3>'")


def test_pages_escape_names_from_the_cluster() -> None:
    row = ClusterPageRow("evil", "<script>alert(1)</script>", "Provider", "healthy", "", (("offloading", "ok"),),
                     10.0, 4, 4, 0, None, 1, 0)
    html = pages.clusters_page(pages.HubContext("/services/gpu-offload/", "admin", True, "", True), [row])
    assert "<script>" not in html and "&lt;script&gt;" in html


@pytest.mark.e2e  # starts a process
def test_a_bad_configuration_stops_the_service_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("liqo:\n  tenantNamespaces: liqo-tenant-a\n")
    done = subprocess.run([sys.executable, "-m", "gpu_offload.hub_extension.service.app"], capture_output=True,
                          text=True, timeout=120, env={"GPU_OFFLOAD_CONFIG": str(config), "PATH": ""})
    assert done.returncode == 1
    assert "liqo.tenantNamespaces must be a list" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(InvalidRequest, match="cannot be read"):
        load_config(tmp_path / "missing.yaml")


def test_a_peer_whose_authentication_failed_is_not_asked_for_gpus(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    config = HubConfig(tenant_namespaces=("liqo-tenant-donor-1",))
    # refused before any request: the client points nowhere and is never used
    operations = Operations(config, kubernetes.client.ApiClient(), store)
    facts = ClusterFacts("origin", {"donor-1": "AuthIdentityControlPlaneStatus=Error"})
    outcome = operations.apply(SliceRequest("donor-1", 2, "donor-1-gpu"), "admin", facts)
    assert not outcome.ok and "not an authenticated peer (authentication: AuthIdentityControlPlaneStatus=Error)" in (
        outcome.message)
    (entry,) = store.audit_log()
    assert (entry.who, entry.action, entry.ok) == ("admin", "resourceslice", False)
    store.close()


def test_the_peering_asks_the_provider_for_the_gpus_the_admin_chose() -> None:
    from gpu_offload.hub_extension.service.actions import parse_action
    from gpu_offload.hub_extension.service.liqoctl import command

    asked = parse_action("peer", {"cluster_id": "donor-3", "gpus": "2"})
    assert isinstance(asked, Peering) and asked.gpus == 2
    # liqoctl peer puts it in the peering's first ResourceSlice; the provider's class decides what it grants
    assert command(asked, "/tmp/k") == ["liqoctl", "peer", "--remote-kubeconfig", "/tmp/k",
                                        "--resource=nvidia.com/gpu=2"]
    assert shown_command(asked).endswith("--resource=nvidia.com/gpu=2")
    assert "asking for 2 GPU(s)" in asked.describe() and asked.form_fields()["gpus"] == "2"
    assert parse_action("peer", {"cluster_id": "donor-3"}).gpus == 0  # Liqo's defaults only
    assert command(parse_action("peer", {"cluster_id": "donor-3", "gpus": " "}), "/k")[-1] == "/k"
    with pytest.raises(InvalidRequest, match="gpus='lots'"):
        parse_action("peer", {"cluster_id": "donor-3", "gpus": "lots"})
    with pytest.raises(InvalidRequest, match="'gpus' is not a field of unpeer"):
        parse_action("unpeer", {"cluster_id": "donor-3", "gpus": "2"})
