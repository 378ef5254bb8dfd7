"""Whether a bound runner pod that has not started is pulling its image, and how long that should take, read from
the pod's events while it waits (:mod:`.image_pull` reads the kubelet's words; this module only asks).

The pod's status does not change while the kubelet pulls (its container waits as ``ContainerCreating``), so the
follower asks every :data:`PULL_CHECK_SECONDS` once such a pod has waited that long (a pod whose image is on the
node starts sooner, and costs no request more): one list of the pod's events, and once per pull one list of the
namespace's ``Pulled`` events for the earlier pulls of the image. Events that cannot be read
(a role without them) only mean the pull is not said: the wait is shown as before.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ....liqo_peering.errors import APIError
from .image_pull import PULLED, Pulled, PullEstimate, pulling_now, pulls_of
from .pods import PodApi

PULL_CHECK_SECONDS = 3
"""How often a bound pod that waits for its container is asked whether it is pulling its image."""


def may_pull(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node, Pending, whose runner container waits to be created (where a kubelet pulls)."""
    status = pod.get("status") or {}
    if not (pod.get("spec") or {}).get("nodeName") or (status.get("phase") or "Pending") != "Pending":
        return False
    statuses = status.get("containerStatuses") or []
    waiting = ((statuses[0].get("state") or {}).get("waiting") or {}) if statuses else {}
    return not statuses or waiting.get("reason") in (None, "", "ContainerCreating")


class PullWatch:
    """The pull of one pod's runner image, as its events say; :meth:`words` is empty when it is not pulling."""

    def __init__(self, pods: PodApi, name: str, uid: str) -> None:
        self.pods = pods
        self.name = name
        self.uid = uid
        self._waiting_since: float | None = None
        """Since when the pod has waited bound for its container, on the kernel's clock (a donor's is not this
        one): a kubelet starts pulling as soon as the pod is bound, so this is when the pull started, give or
        take the pod's volumes."""
        self._earlier: tuple[Pulled, ...] | None = None
        """The earlier pulls of the image, read once the pull is seen."""
        self._unreadable = False

    def words(self, pod: Mapping[str, Any]) -> str:
        """``pulling image X for 12 s; earlier pulls ...``, or empty (not pulling, or events unreadable)."""
        now = time.monotonic()
        if not may_pull(pod):
            self._waiting_since = None
            return ""
        if self._waiting_since is None:
            self._waiting_since = now
        if self._unreadable or now - self._waiting_since < PULL_CHECK_SECONDS / 2:
            return ""
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        image = str(containers[0].get("image") or "")
        try:
            pulling = pulling_now(self.pods.pod_events(self.name), self.uid, image)
            if pulling and self._earlier is None:
                self._earlier = tuple(pulls_of(self.pods.events_of_reason(PULLED), image))
        except APIError:
            self._unreadable = True  # it would be refused again: the wait is shown without it
            return ""
        if not pulling:
            return ""
        return PullEstimate(image, now - self._waiting_since, self._earlier or ()).text()
