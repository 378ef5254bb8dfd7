"""What ``gpu-offload runs``, ``logs`` and ``cancel`` read: the panel's listing of the user's runs (records of
every kernel and CLI command in the state directory, and on a configured cluster the runner pods labelled
with the user), as rows for a shell."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.backends.base import UserRuns
from ..engine.runs.listing import RunListing, list_runs
from ..engine.runs.records import RunBook, RunEntry

if TYPE_CHECKING:
    from ..engine.backends.kube.storage import RunStorage


@dataclass(frozen=True)
class Where:
    """The state directory and, when one is configured, the user's runner pods on the cluster."""

    book: RunBook
    runs: UserRuns | None
    """The user's runs the cluster holds (its runner pods)."""
    user: str
    storage: RunStorage | None = None
    """The user's objects in the configured bucket (``GPU_OFFLOAD_S3_BUCKET``): background runs' logs."""


def where() -> Where:
    """As the magic finds them: ``GPU_OFFLOAD_STATE_DIR`` (or Jupyter's runtime directory) and the cluster of
    ``KUBECONFIG`` with ``GPU_OFFLOAD_NAMESPACE`` (else its context's namespace); an unreachable cluster is a
    problem of the listing."""
    from ..engine.backends import registry
    from ..liqo_peering.settings import kernel_settings

    settings = kernel_settings()
    user = os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
    runs = registry.user_runs(os.environ)
    storage = None
    bucket = settings.s3_bucket
    if bucket:
        from ..engine.backends.kube.config import StorageSettings
        from ..engine.backends.kube.storage import RunStorage

        storage = RunStorage(StorageSettings(bucket, settings.s3_endpoint), user)
    return Where(RunBook(), runs, user, storage)


def listing(place: Where) -> RunListing:
    """Every run of the user, newest first."""
    return list_runs((), place.book, place.runs)


def kind(record: RunEntry) -> str:
    """``script`` for a ``gpu-offload run``, ``cell`` for a notebook's."""
    return "cell" if record.script is None else "script"


def find(runs: tuple[RunEntry, ...], wanted: str) -> RunEntry | None:
    """The run whose id is ``wanted``, or the only one whose id starts with it."""
    exact = [r for r in runs if r.run_id == wanted]
    prefixed = [r for r in runs if r.run_id.startswith(wanted)]
    return exact[0] if exact else prefixed[0] if len(prefixed) == 1 else None
