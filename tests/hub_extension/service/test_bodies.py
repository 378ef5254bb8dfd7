"""The hot endpoints' kept bodies: they follow every watch event, carry an ETag, and are never given to
someone who may not see them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import http

VN = ("offloading.liqo.io", "v1beta1")
CORDONED = "gpu-offload.io/cordoned"


@pytest.fixture(scope="module")
def custom(origin: RunningOrigin) -> Iterator[kubernetes.client.CustomObjectsApi]:
    client = origin.sandbox.api_client()
    yield kubernetes.client.CustomObjectsApi(client)
    client.close()


def _cordon(custom: Any, cordoned: bool) -> None:
    """Cordon (or uncordon) donor-1's virtual node straight through the API, as an operator's kubectl would."""
    labels = {CORDONED: "true" if cordoned else None}
    custom.patch_namespaced_custom_object(*VN, "liqo-tenant-donor-1", "virtualnodes", "donor-1-gpu",
                                          {"spec": {"labels": labels}})


@pytest.fixture()
def cordoned_donor(custom: Any) -> Iterator[None]:
    """donor-1-gpu cordoned for the test, uncordoned after it whatever happened."""
    _cordon(custom, True)
    try:
        yield
    finally:
        _cordon(custom, False)


def test_a_kept_body_shows_a_watch_event_as_soon_as_the_cache_has_it(origin: RunningOrigin, custom: Any,
                                                                     tmp_path: Path) -> None:
    client = origin.sandbox.api_client()
    state = HubState(HubConfig(), client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
    try:
        assert state.wait_synced(60)
        before_clusters, before_inventory = state.clusters_body(), state.inventory_body()
        assert b'"cordoned": 0' in before_clusters.data
        assert state.inventory_body() is before_inventory  # nothing changed: the same bytes, not rebuilt
        _cordon(custom, True)
        try:
            # once the inventory the cache builds has the cordon, the kept bodies must have it too, with no wait
            wait_until(lambda: state.inventory().cluster("donor-1").virtual_nodes[0].cordoned,  # type: ignore[union-attr]
                       "the service's watch to deliver the cordon")
            inventory = state.inventory_body()
            assert inventory.etag != before_inventory.etag
            assert b'"free_gpus_by_model": {"A100": 4}' in inventory.data  # donor-1's 4 GPUs are out
            clusters = state.clusters_body()
            assert b'"cordoned": 1' in clusters.data and clusters.etag != before_clusters.etag
        finally:
            _cordon(custom, False)
        wait_until(lambda: not state.inventory().cluster("donor-1").virtual_nodes[0].cordoned,  # type: ignore[union-attr]
                   "the service's watch to deliver the uncordon")
        assert b'"free_gpus_by_model": {"A100": 8}' in state.inventory_body().data
    finally:
        state.close()
        client.close()


def _etag(answer: Any) -> str | None:
    # the proxy passes header names in lower case
    return {k.lower(): v for k, v in answer.headers.items()}.get("etag")


def _get(hub: Any, path: str, user: str, etag: str | None = None) -> Any:
    headers = {"If-None-Match": etag} if etag else {}
    return http("GET", f"{hub.service_url}{path}", hub.token(user), headers=headers)


def test_the_api_answers_304_for_the_body_the_client_has_and_the_new_body_after_a_change(
        hub: Any, custom: Any) -> None:
    first = _get(hub, "api/inventory", "alice")
    assert first.status == 200 and first.json()["free_gpus_by_model"] == {"A100": 8}
    etag = _etag(first)
    unchanged = _get(hub, "api/inventory", "alice", etag)
    assert unchanged.status == 304 and unchanged.body == b""
    _cordon(custom, True)
    try:
        changed = wait_until(lambda: (r := _get(hub, "api/inventory", "alice", etag)).status == 200 and r,
                             "the service to see the cordon")
        assert changed.json()["free_gpus_by_model"] == {"A100": 4} and _etag(changed) != etag
        rows = {r["cluster_id"]: r for r in _get(hub, "api/admin/clusters", "admin").json()["clusters"]}
        assert rows["donor-1"]["cordoned"] == 1  # the admin's kept body follows the same event
    finally:
        _cordon(custom, False)
    wait_until(lambda: _get(hub, "api/inventory", "alice").json()["free_gpus_by_model"] == {"A100": 8},
               "the service to see the uncordon")


def test_an_admins_kept_body_is_never_given_to_a_plain_user(hub: Any) -> None:
    admin = _get(hub, "api/admin/clusters", "admin")
    assert admin.status == 200 and "donor-1" in admin.text
    # alice may not see the clusters API: neither the kept body nor a 304 confirming the admin's ETag
    for etag in (None, _etag(admin)):
        refused = _get(hub, "api/admin/clusters", "alice", etag)
        assert refused.status == 403, refused.status
        assert "donor-1" not in refused.text and "gpus_total" not in refused.text
        assert _etag(refused) is None
    # the viewer role may, and gets what the admin got (the body holds nothing per user; ages move on)
    viewer = _get(hub, "api/admin/clusters", "vera")
    assert viewer.status == 200

    def ageless(answer: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "age_seconds"} for row in answer.json()["clusters"]]
    assert ageless(viewer) == ageless(admin)
