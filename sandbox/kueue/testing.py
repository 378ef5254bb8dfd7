"""An origin with Liqo donors and Kueue, for tests of code that queues through Kueue::

    with running_kueue_origin(tmp_path, donors=2, crds=[LIQO_CRDS, KUEUE_CRDS]) as (origin, kueue):
        core = kubernetes.client.CoreV1Api(origin.sandbox.api_client())

``kueue.controller.queue_order`` is what the visibility API serves. Pods really run (the origin's
scheduler and kubelet); Kueue's plugin goes after the origin's, as its controller needs the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..liqo import seed as liqo
from ..liqo.origin import RunningOrigin, running_origin
from . import Kueue, KueueOptions


@contextmanager
def running_kueue_origin(workdir: Path, donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4,
                         gpu_model: str = "A100", crds: Sequence[Path] = (),
                         kueue: KueueOptions | None = None, **options: Any) -> Iterator[tuple[RunningOrigin, Kueue]]:
    """An origin with ``donors`` Liqo donors and Kueue, served from a background thread for the block."""
    plugin = Kueue(kueue or KueueOptions())
    with running_origin(workdir, donors, gpus, gpu_model, crds=list(crds), plugins=[plugin.plugin],
                        **options) as running:
        yield running, plugin
