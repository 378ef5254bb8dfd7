"""Which priority class a runner pod starts with (pure): every pod waits in line at its own class (a protected
session too: starting at the protected class jumped the queue); a queued session of a kernel with protection is
raised to the protected class once it runs and lowered to its own later."""

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
     ("interactive", Protection("interactive", "session-protected", 600.0))),
    (RunRequest(priority="batch"), True, "q", PROTECTED,
     ("batch", Protection("batch", "session-protected", 600.0))),
    (RunRequest(), False, "q", PROTECTED, ("interactive", None)),  # a one-shot cell is never protected
    (RunRequest(), True, None, PROTECTED, (None, None)),  # no queue: no Kueue, no classes
    (RunRequest(ranks=Ranks(2, 1)), True, "q", PROTECTED, ("interactive", None)),  # a distributed session: not yet
    (RunRequest(), True, "q", KubeSettings(namespace="ns", priority="interactive"), ("interactive", None)),
    # no class of its own (Kueue refuses adding the label to a running pod, and removing it): no protection
    (RunRequest(), True, "q", KubeSettings(namespace="ns", session_protection=600.0,
                                           protected_priority="session-protected"), (None, None)),
], ids=["session", "own-priority", "one-shot", "no-queue", "distributed", "protection-off", "no-own-class"])
def test_a_queued_session_waits_at_its_own_class_and_names_the_class_it_is_raised_to(
        placement: RunRequest, session: bool, queue: str | None, settings: KubeSettings, expected: Any) -> None:
    assert session_priority(placement, session, queue, settings) == expected


def test_a_cell_naming_the_protected_class_itself_is_refused() -> None:
    with pytest.raises(OffloadUsageError, match=r"--priority session-protected is the class a session runs at"):
        session_priority(RunRequest(priority="session-protected"), False, "q", PROTECTED)
