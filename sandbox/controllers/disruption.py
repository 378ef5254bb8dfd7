"""The disruption controller: a PodDisruptionBudget's status follows the pods it selects, as kube-controller-manager
1.35 writes it (``pkg/controller/disruption``), so an Eviction (``apiserver/eviction.py``) reads what a real
cluster would.

For each budget: ``expectedPods`` the pods of its namespace its selector selects (an empty selector selects none),
``currentHealthy`` those Ready and not being deleted nor recorded in ``disruptedPods``, ``desiredHealthy`` its
integer ``minAvailable``, ``disruptionsAllowed`` the healthy pods above that (0 when none is expected), the
condition ``DisruptionAllowed`` (reason ``SufficientPods`` or ``InsufficientPods``) and ``observedGeneration``.
``disruptedPods`` keeps a pod an Eviction recorded until the pod is being deleted, is gone, or two minutes
passed. A ``maxUnavailable`` or a percentage needs the pods' controller's scale: the sandbox serves no scalable
controller (a Job has no scale), so as the real controller does for unmanaged pods, none is expected and no
disruption is allowed.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from dateutil.parser import isoparse

from ..apiserver.api import Api
from ..apiserver.defaults import now
from ..apiserver.errors import ApiError
from ..apiserver.eviction import pod_ready
from ..apiserver.matching import label_selector_matches

Obj = dict[str, Any]
DELETION_TIMEOUT = timedelta(minutes=2)
"""How long a pod an Eviction recorded stays out of the healthy count if it is not deleted (the real one's)."""


def _selected(budget: Obj, pods: list[Obj]) -> list[Obj]:
    selector = (budget.get("spec") or {}).get("selector") or {}
    if not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return []
    namespace = budget["metadata"]["namespace"]
    return [p for p in pods if p["metadata"]["namespace"] == namespace
            and label_selector_matches(selector, p["metadata"].get("labels") or {})]


def budget_status(budget: Obj, pods: list[Obj], at: datetime) -> tuple[Obj, float | None]:
    """The status the controller writes for ``budget`` over every pod in ``pods`` (pure); and the seconds until
    a recorded disruption expires (None: none pending)."""
    selected = _selected(budget, pods)
    by_name = {p["metadata"]["name"]: p for p in selected}
    disrupted, expiries = {}, []
    for name, stamp in ((budget.get("status") or {}).get("disruptedPods") or {}).items():
        pod = by_name.get(name)
        expires = isoparse(stamp) + DELETION_TIMEOUT
        if pod is None or pod["metadata"].get("deletionTimestamp") or expires <= at:
            continue
        disrupted[name] = stamp
        expiries.append((expires - at).total_seconds())
    healthy = sum(1 for p in selected if not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"]
                  not in disrupted and pod_ready(p))
    spec = budget.get("spec") or {}
    minimum = spec.get("minAvailable")
    expected, desired = (len(selected), minimum) if isinstance(minimum, int) else (0, 0)
    allowed = healthy - desired if expected > 0 and healthy > desired else 0
    generation = int(budget["metadata"].get("generation") or 1)
    old = (budget.get("status") or {}).get("conditions") or []
    state, reason = ("True", "SufficientPods") if allowed > 0 else ("False", "InsufficientPods")
    since = next((c.get("lastTransitionTime") for c in old
                  if c.get("type") == "DisruptionAllowed" and c.get("status") == state), None) or now()
    status: Obj = {"observedGeneration": generation}
    if disrupted:
        status["disruptedPods"] = disrupted
    status.update({"disruptionsAllowed": allowed, "currentHealthy": healthy, "desiredHealthy": desired,
                   "expectedPods": expected,
                   "conditions": [{"type": "DisruptionAllowed", "status": state, "observedGeneration": generation,
                                   "lastTransitionTime": since, "reason": reason, "message": ""}]})
    return status, min(expiries) if expiries else None


def _sweep(api: Api) -> float | None:
    budgets_type, pods_type = api.type("policy", "v1", "poddisruptionbudgets"), api.type("", "v1", "pods")
    budgets = api.list(budgets_type)["items"]
    if not budgets:  # most sandboxes have none: a pod event then costs no listing of every pod
        return None
    pods = api.list(pods_type)["items"]
    waits = []
    for budget in budgets:
        status, wait = budget_status(budget, pods, datetime.now(timezone.utc))
        if wait is not None:
            waits.append(wait)
        if status == budget.get("status"):
            continue
        meta = budget["metadata"]
        try:
            api.replace(budgets_type, meta["namespace"], meta["name"], {**budget, "status": status}, "status")
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise  # changed or gone under us: the event of that change triggers another sweep
    return min(waits) if waits else None


async def disruption_controller(api: Api) -> None:
    """Run forever on the server's loop: sweep on every budget or pod change, and when a recorded disruption
    expires."""
    keys = (("policy", "poddisruptionbudgets"), ("", "pods"))
    sub = api.store.subscribe(None)
    try:
        wait = _sweep(api)
        while True:
            await sub.next_of(keys, wait)
            await asyncio.sleep(0)  # coalesce a burst of events into one sweep
            wait = _sweep(api)
    finally:
        sub.close()
