"""How long a warm session may sit idle holding its GPUs: the hub's timeout, or a shorter one the user asks for
with ``--idle-timeout`` (never a longer one: the hub's is the pool's promise to everyone else), and the words
``%gpu_offload status`` and the notebook use for it. Pure: no clock is read here but the one passed in."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ....liqo_peering.wording import duration

HUB = "the hub's offload.sessionIdleTimeout"
ASKED = "--idle-timeout"


@dataclass(frozen=True)
class IdleTimeout:
    """A session's idle timeout and where it comes from."""

    seconds: float
    """0: the session is never released for idling."""
    source: str
    """``HUB`` or ``ASKED``."""


class IdleTimeouts:
    """The hub's idle timeout and the shorter ones sessions asked for, by session name."""

    def __init__(self, hub: float) -> None:
        self.hub = max(0.0, hub)
        self._asked: dict[str, float] = {}

    def of(self, name: str) -> IdleTimeout:
        """Session ``name``'s timeout now."""
        asked = self._asked.get(name)
        return IdleTimeout(asked, ASKED) if asked is not None else IdleTimeout(self.hub, HUB)

    def ask(self, name: str, seconds: float | None) -> tuple[str, bool] | None:
        """A cell of session ``name`` gave ``--idle-timeout``: keep it (at most the hub's); what the cell is told
        when the session's timeout changed (and whether that is a warning: more than the hub allows)."""
        if seconds is None:
            return None
        kept = seconds if self.hub <= 0 else min(seconds, self.hub)
        before = self.of(name)
        self._asked[name] = kept
        if before == self.of(name):
            return None  # said already
        after = duration(kept, "min")
        if kept < seconds:
            return (f"--idle-timeout {seconds / 60:g}: {HUB} is {duration(self.hub, 'min')}, the longest a session may "
                    f"sit idle holding GPUs, so session {name} is released after {after} idle", True)
        return (f"session {name} is released after {after} idle from now on ({ASKED}; checkpointed "
                "first when the cluster has object storage)", False)

    def forget(self, name: str) -> None:
        """The user closed session ``name``: a new session of that name starts with the hub's timeout."""
        self._asked.pop(name, None)


def release_words(timeout: IdleTimeout, release_at: float | None, now: float) -> str:
    """When an idle session is released, for ``%gpu_offload sessions`` and ``status``: ``release_at`` is the
    wall-clock time its idle timer ends (``None`` while a cell runs or before the first one ended)."""
    if timeout.seconds <= 0:
        return ""
    rule = f"released after {duration(timeout.seconds, 'min')} idle ({timeout.source})"
    if release_at is None:
        return rule
    at = time.strftime("%H:%M:%S UTC", time.gmtime(release_at))
    return f"{rule}: at {at}, in {duration(max(0.0, release_at - now), 'min')}, unless a cell comes first"
