"""What the sandbox's Kueue is configured with (the parts of Kueue's Configuration it emulates)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .webhook import DEFAULT_NAMESPACE_SELECTOR


@dataclass(frozen=True)
class KueueOptions:
    """Kueue's Configuration, reduced to what the sandbox emulates."""

    namespace_selector: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_NAMESPACE_SELECTOR))
    """``managedJobsNamespaceSelector``: pods and Jobs of other namespaces are left alone."""
    pods_ready_timeout: float | None = 1800.0
    """``waitForPodsReady.timeout`` in seconds: Kueue 0.19 turns waitForPodsReady on by default with 30 minutes
    (None: off, as an admin may configure it)."""
    requeue_base_seconds: float = 60.0
    """``waitForPodsReady.requeuingStrategy.backoffBaseSeconds``: the n-th requeue waits base * 2^(n-1)."""
    usage_half_life: float = 600.0
    """``admissionFairSharing.usageHalfLifeTime`` in seconds."""
    usage_sampling: float = 300.0
    """``admissionFairSharing.usageSamplingInterval`` in seconds (Kueue's default 5 min)."""
    exclude_resource_prefixes: tuple[str, ...] = ()
    """``resources.excludeResourcePrefixes``: resources Kueue ignores in quota (none by default, as in Kueue);
    a Workload asking for a resource neither excluded nor covered by its ClusterQueue is never admitted."""
    resource_weights: Mapping[str, float] = field(default_factory=dict)
    """``admissionFairSharing.resourceWeights``: how much a unit of each resource counts in a LocalQueue's
    usage (1 when absent)."""
    tick: float = 0.2
    """How often the controller looks at timeouts when nothing changes (sandbox only)."""
