"""What a kubelet is set up with: its tunables, and how it learns the names a donor holds a pod's
namespaces under (both read by the kubelet and by each of its pod workers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NameView = Callable[[dict[str, Any]], "dict[str, str] | None"]
"""``names(pod)`` -> the namespaces the pod's cluster holds, under the names it holds them (origin name ->
name there), when the pod runs in another cluster than the API's (a Liqo donor); None: this cluster's names."""


@dataclass(frozen=True)
class KubeletConfig:
    """Tunables of the test kubelet."""

    state_dir: Path
    """Where pod folders and image runtimes live."""
    backoff: float = 0.5
    """First back-off (image pull, mount, restart) in seconds; a real kubelet starts at 10 s."""
    max_backoff: float = 5.0
    """Back-off ceiling; a real kubelet stops at 300 s."""
    isolate: bool = True
    """Where the sandbox runs as root: a network namespace per pod, containers in their own PID namespace
    as their runAsUser (``isolation.py``). False: every pod shares the host's network and runs as the
    sandbox's user, as on a machine without root."""
