"""The service's live state: every kind is watched once, the pages read it without requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_offload.hub_extension.accounting.store import Store
from gpu_offload.hub_extension.config import HubConfig
from gpu_offload.hub_extension.service.state import HubState
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin


def test_foreign_clusters_are_listed_and_watched_once_for_the_cache_and_the_pages(
        origin: RunningOrigin, api_client: Any, tmp_path: Path) -> None:
    faults = origin.sandbox.api.faults
    # a rule with a negligible delay changes nothing but counts the requests it sees
    counter = faults.add(FaultRule(r"^/apis/core\.liqo\.io/v1beta1/foreignclusters$", ("GET",), delay=0.001))
    state = HubState(HubConfig(), api_client, Store(f"sqlite:///{tmp_path}/usage.sqlite")).start()
    try:
        assert state.wait_synced(60)
        rows = state.cluster_rows()
        assert {r.cluster_id for r in rows} == {"donor-1", "donor-2"}
        assert state.facts().authentication == {"donor-1": "ok", "donor-2": "ok"}
        wait_until(lambda: faults.fired(counter) >= 2, "the ForeignCluster watch")
        assert faults.fired(counter) == 2  # one list, one watch: not one pair for the cache and one for the pages
    finally:
        state.close()
        faults.remove(counter)
