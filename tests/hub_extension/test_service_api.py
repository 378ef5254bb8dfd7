"""The service's JSON API and pages through a real JupyterHub: who may see and do what."""

from __future__ import annotations

from typing import Any


def test_admin_sees_both_donors_with_their_gpus(hub: Any) -> None:
    answer = hub.api("GET", "api/admin/clusters", "admin")
    assert answer.status == 200, answer.text
    rows = {r["cluster_id"]: r for r in answer.json()["clusters"]}
    assert set(rows) == {"donor-1", "donor-2"}
    assert all(r["gpus_total"] == 4 and r["health"] == "healthy" for r in rows.values())
