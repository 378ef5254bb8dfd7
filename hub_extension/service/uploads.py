"""Uploaded kubeconfigs held server-side between the confirmation page and the confirmed action.

The confirmation page carries only a one-time token, never the kubeconfig: the credentials are not sent
back to the browser (page caches, screenshots, extensions) and a confirmed form cannot swap in another
file. A token works once, for the user who uploaded, the same action and cluster, within ``TTL_SECONDS``.
Held in the service's memory only: a restarted service forgets them and the operator uploads again.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpu_offload.liqo_peering.errors import InvalidRequest

TTL_SECONDS = 600.0
MAX_HELD = 64
"""Uploads waiting for confirmation at once; the oldest is forgotten first (bounds the memory they take)."""


@dataclass(frozen=True)
class Held:
    """One upload waiting for its confirmation."""

    user: str
    kind: str
    cluster_id: str
    kubeconfig: str
    expires: float


class KubeconfigVault:
    """One-time tokens for uploaded kubeconfigs (thread-safe: actions run in the service's executor)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = TTL_SECONDS) -> None:
        self._clock = clock
        self._ttl = ttl
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()

    def hold(self, user: str, kind: str, cluster_id: str, kubeconfig: str) -> str:
        """A fresh token standing for ``kubeconfig`` until it is redeemed once or expires."""
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._held = {t: h for t, h in self._held.items() if h.expires > now}
            while len(self._held) >= MAX_HELD:
                del self._held[next(iter(self._held))]
            self._held[token] = Held(user, kind, cluster_id, kubeconfig, now + self._ttl)
        return token

    def redeem(self, token: str, user: str, kind: str, cluster_id: str) -> str:
        """The kubeconfig ``token`` stands for, which it no longer does afterwards; InvalidRequest otherwise."""
        with self._lock:
            held = self._held.pop(token, None)
        again = f"upload the kubeconfig again and confirm within {self._ttl / 60:g} minutes"
        if held is None or held.expires <= self._clock():
            raise InvalidRequest(f"kubeconfig_token: unknown, already used or expired; {again}")
        if (held.user, held.kind, held.cluster_id) != (user, kind, cluster_id):
            raise InvalidRequest(f"kubeconfig_token: it was issued to {held.user} for {held.kind} {held.cluster_id}, "
                                 f"not to {user} for {kind} {cluster_id}; {again}")
        return held.kubeconfig
