"""Which priority class a runner pod starts with (pure): a queued session of a kernel with protection starts
at the protected class and is lowered to its own later; everything else runs at its own class."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.config import KubeSettings
from gpu_offload.engine.backends.kube.protection import Protection, session_priority
from gpu_offload.engine.errors import OffloadUsageError

PROTECTED = KubeSettings(namespace="ns", priority="interactive", session_protection=600.0,
                         protected_priority="session-protected")


@pytest.mark.parametrize("placement, session, queue, settings, expected", [
    (RunRequest(), True, "q", PROTECTED,
     ("session-protected", Protection("session-protected", "interactive", 600.0))),
    (RunRequest(priority="batch"), True, "q", PROTECTED,
     ("session-protected", Protection("session-protected", "batch", 600.0))),
    (RunRequest(), False, "q", PROTECTED, ("interactive", None)),  # a one-shot cell is never protected
    (RunRequest(), True, None, PROTECTED, (None, None)),  # no queue: no Kueue, no classes
    (RunRequest(ranks=Ranks(2, 1)), True, "q", PROTECTED, ("interactive", None)),  # a distributed session: not yet
    (RunRequest(), True, "q", KubeSettings(namespace="ns", priority="interactive"), ("interactive", None)),
    # nothing to lower to (Kueue refuses removing the label from a running pod): no protection
    (RunRequest(), True, "q", KubeSettings(namespace="ns", session_protection=600.0,
                                           protected_priority="session-protected"), (None, None)),
], ids=["session", "own-priority", "one-shot", "no-queue", "distributed", "protection-off", "no-own-class"])
def test_a_queued_session_starts_protected_and_names_the_class_it_is_lowered_to(
        placement: RunRequest, session: bool, queue: str | None, settings: KubeSettings, expected: Any) -> None:
    assert session_priority(placement, session, queue, settings) == expected


def test_a_cell_naming_the_protected_class_itself_is_refused() -> None:
    with pytest.raises(OffloadUsageError, match=r"--priority session-protected is the class a session starts with"):
        session_priority(RunRequest(priority="session-protected"), False, "q", PROTECTED)
