"""``POST pods/<name>/eviction`` (policy/v1 ``Eviction``): a deletion that honours PodDisruptionBudgets, as
kube-apiserver 1.35 serves it (``pkg/registry/core/pod/storage/eviction.go``), and as ``kubectl drain`` uses it.

- A pod that is Pending, Succeeded, Failed or already being deleted is deleted without asking a budget.
- Otherwise the budgets of the pod's namespace whose selector matches its labels decide (an empty selector
  matches nothing): none, the pod is deleted; more than one, 500; one whose status the disruption controller has
  not caught up with (``observedGeneration`` below ``generation``), 429 with a ``Retry-After`` of 10 s; one that
  allows no disruption, 429 "Cannot evict pod as it would violate the pod's disruption budget." with a
  ``DisruptionBudget`` cause naming how many healthy pods it needs and has. An allowed eviction takes one from
  ``disruptionsAllowed`` and records the pod in ``disruptedPods`` before the pod is deleted, so a second eviction
  at once cannot take the same budget twice. A pod that is not Ready is evicted without taking from the budget
  when the budget's ``unhealthyPodEvictionPolicy`` is ``AlwaysAllow``, or, by default (``IfHealthyBudget``),
  when the budget has its healthy pods.
- Before the deletion the pod gets the condition ``DisruptionTarget`` (reason ``EvictionByEvictionAPI``), then it is
  deleted with the Eviction's ``deleteOptions`` (its grace period: the kubelet sends SIGTERM and waits).
- A missing pod: 404 ``pods "x" not found``; the Eviction's name must be the URL's (400).
Answer: 201 with a ``Status`` of ``Success``. Not emulated: ``dryRun``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .defaults import now
from .errors import ApiError, Cause, bad_request, conflict
from .matching import label_selector_matches
from .patching import MERGE

if TYPE_CHECKING:
    from .api import Api

Obj = dict[str, Any]
VIOLATES = "Cannot evict pod as it would violate the pod's disruption budget."
MAX_DISRUPTED_PODS = 2000
"""Above this many evictions the disruption controller has not yet seen, a budget refuses more (403)."""
SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _too_many(message: str, retry_after: int) -> ApiError:
    return ApiError(429, "TooManyRequests", VIOLATES, causes=(Cause("DisruptionBudget", message),),
                    retry_after=retry_after)


def pod_ready(pod: Obj) -> bool:
    """The pod's Ready condition is True (what a budget counts as healthy)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def budgets_of(api: Api, pod: Obj) -> list[Obj]:
    """The PodDisruptionBudgets of the pod's namespace that select it (an empty selector selects nothing)."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    found = api.list(api.type("policy", "v1", "poddisruptionbudgets"), meta["namespace"])["items"]
    return [b for b in found if (selector := (b.get("spec") or {}).get("selector"))
            and (selector.get("matchLabels") or selector.get("matchExpressions"))
            and label_selector_matches(selector, labels)]


def _ignores_budgets(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool(pod["metadata"].get("deletionTimestamp"))


def _take_from(api: Api, budget: Obj, pod_name: str) -> None:
    """Check the budget allows one more disruption and take it (eviction.go's checkAndDecrement)."""
    meta, status = budget["metadata"], dict(budget.get("status") or {})
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
        raise _too_many(f"The disruption budget {meta['name']} is still being processed by the server.", 10)
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{meta["name"]}" is forbidden: pdb disruptions '
                       "allowed is negative", meta["name"], "policy", "poddisruptionbudget")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        raise ApiError(403, "Forbidden", f'poddisruptionbudget.policy "{meta["name"]}" is forbidden: DisruptedPods map '
                       "too big - too many evictions not confirmed by PDB controller", meta["name"], "policy",
                       "poddisruptionbudget")
    if allowed == 0:
        raise _too_many(f"The disruption budget {meta['name']} needs {status.get('desiredHealthy', 0)} healthy pods "
                        f"and has {status.get('currentHealthy', 0)} currently", 0)
    status["disruptionsAllowed"] = allowed - 1
    if allowed == 1:
        status["conditions"] = [dict(c, status="False", reason="InsufficientPods", lastTransitionTime=now())
                                if c.get("type") == "DisruptionAllowed" and c.get("status") != "False" else c
                                for c in status.get("conditions") or []]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: stamp}
    api.replace(api.type("policy", "v1", "poddisruptionbudgets"), meta["namespace"], meta["name"],
                {**budget, "status": status}, "status")


def _unhealthy_may_go(budget: Obj) -> bool:
    """A pod that is not Ready goes without taking from the budget (its unhealthyPodEvictionPolicy)."""
    status = budget.get("status") or {}
    if (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    desired = int(status.get("desiredHealthy") or 0)
    return int(status.get("currentHealthy") or 0) >= desired > 0


def _mark_and_delete(api: Api, pod: Obj, options: Obj) -> None:
    pods = api.type("", "v1", "pods")
    meta = pod["metadata"]
    pre = options.get("preconditions") or {}
    for key, what in (("uid", "UID"), ("resourceVersion", "resourceVersion")):
        if pre.get(key) and pre[key] != meta[key]:
            raise conflict("", "pods", meta["name"], f"Precondition failed: {what} in precondition does not match")
    kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    target = {"type": "DisruptionTarget", "status": "True", "lastProbeTime": None, "lastTransitionTime": now(),
              "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
    api.patch(pods, meta["namespace"], meta["name"], {"status": {"conditions": [*kept, target]}}, MERGE, "status")
    grace = options.get("gracePeriodSeconds")
    # the preconditions held for the pod as read; the condition just written changed its resourceVersion
    api.delete(pods, meta["namespace"], meta["name"], int(grace) if grace is not None else None,
               options.get("propagationPolicy"))


def evict(api: Api, namespace: str, name: str, body: Any) -> Obj:
    """Serve one Eviction of pod ``name``; returns the ``Status`` body (raises the refusals as ApiError)."""
    if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
        raise bad_request(f"not a Eviction object: {type(body).__name__ if not isinstance(body, dict) else body.get('kind')}")
    if ((body.get("metadata") or {}).get("name") or "") != name:
        raise bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    if options.get("dryRun"):
        raise bad_request("dryRun is not emulated by the sandbox: send the Eviction without it")
    pods = api.type("", "v1", "pods")
    with api.store.lock:  # the budget read, its decrement and the deletion are one step, as the real retry loop makes them
        pod = api.get(pods, namespace, name)
        if _ignores_budgets(pod):
            _mark_and_delete(api, pod, options)
            return dict(SUCCESS)
        budgets = budgets_of(api, pod)
        if len(budgets) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                                                 "subresource does not support.")
        # a pod that is not Ready may go without taking from the budget; under the store's lock it cannot become
        # Ready before its deletion (the real server guards that with a resourceVersion precondition)
        if budgets and not (not pod_ready(pod) and _unhealthy_may_go(budgets[0])):
            _take_from(api, budgets[0], name)
        _mark_and_delete(api, pod, options)
    return dict(SUCCESS)
