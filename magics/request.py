"""What one offloaded cell asks for: the frozen :class:`OffloadRequest`, validated on creation."""

from __future__ import annotations

import keyword
from dataclasses import dataclass

from .errors import OffloadUsageError

BACKENDS = ("local", "kubernetes")


@dataclass(frozen=True)
class OffloadRequest:
    """One ``%%gpu_offload`` invocation, after parsing and before analysis of the cell."""

    cell: str
    """The cell body (without the ``%%gpu_offload`` line)."""
    gpus: int = 1
    """How many GPUs the runner may see; 0 runs on CPU."""
    gpu_model: str | None = None
    """A GPU model to ask for (e.g. ``A100``); only placement on a cluster uses it."""
    fallback_models: tuple[str, ...] = ()
    """Models to take, in order, when ``gpu_model`` has no room (``--gpu-model A100,H100``)."""
    cluster: str = "auto"
    """A remote cluster id, or ``auto`` to let placement choose."""
    inputs: tuple[str, ...] = ()
    """Names to send in addition to those the cell reads (``--in``)."""
    outputs: tuple[str, ...] = ()
    """Names to copy back in addition to those the cell assigns; failing to copy one is an error."""
    session: str | None = None
    """A warm runner whose state persists across cells; ``None`` starts a fresh runner."""
    noblock: bool = False
    """Return a handle at once instead of following the run."""
    timeout: float | None = None
    """Seconds after which the cell is interrupted; ``None`` waits forever."""
    image: str | None = None
    """Container image for a cluster backend; the local backend runs this kernel's Python."""
    backend: str | None = None
    """``local`` or ``kubernetes``; ``None`` uses the configured default."""
    priority: str | None = None
    """A Kueue priority class (``--priority``) when queueing is on; ``None`` uses the configured default."""
    queue_timeout: float | None = None
    """Seconds a run may wait in the queue (queueing on) before it is withdrawn; ``None`` waits as long as it takes."""
    trusted_only: bool = False
    """Run only on a cluster the origin trusts (``--trusted-only``): the donor sees the cell and its inputs."""

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise OffloadUsageError(
                f"--gpus {self.gpus}: the number of GPUs cannot be negative. "
                "Write --gpus 1 for one GPU, or --gpus 0 to run on CPU."
            )
        if self.timeout is not None and self.timeout <= 0:
            raise OffloadUsageError(
                f"--timeout {self.timeout:g}: the timeout must be a positive number of seconds, "
                "e.g. --timeout 600; leave it out to wait without a limit."
            )
        if self.queue_timeout is not None and self.queue_timeout <= 0:
            raise OffloadUsageError(
                f"--queue-timeout {self.queue_timeout:g}: give a positive number of seconds, e.g. --queue-timeout "
                "300; leave it out to wait in the queue as long as it takes."
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise OffloadUsageError(
                f"--backend {self.backend}: unknown backend. Write --backend local or --backend kubernetes."
            )
        for option, names in (("--in", self.inputs), ("--out", self.outputs)):
            for name in names:
                if not name.isidentifier() or keyword.iskeyword(name):
                    raise OffloadUsageError(
                        f"{option} {','.join(names)}: `{name}` is not a Python variable name. "
                        f"Write a comma-separated list of names, e.g. {option} a,b."
                    )
        if self.priority is not None and not _is_class_name(self.priority):
            raise OffloadUsageError(
                f"--priority {self.priority!r}: a priority class is a lowercase name of letters, digits and '-', "
                "e.g. --priority batch (`gpu-offload queues` lists the classes)."
            )
        if self.session is not None and not _is_session_name(self.session):
            raise OffloadUsageError(
                f"--session {self.session!r}: a session name uses letters, digits, '-', '_' or '.' "
                "(up to 63 characters), e.g. --session train."
            )


def ignored_locally(request: OffloadRequest, default_gpu_model: str | None = None) -> list[str]:
    """The options of ``request`` that only choose where a cluster runs it, which the local backend ignores
    (a GPU model that is only the configured default was not asked for)."""
    models = ",".join((request.gpu_model, *request.fallback_models)) if request.gpu_model else None
    chosen = [option for option, value in (("--gpu-model", models), ("--image", request.image),
                                                   ("--priority", request.priority),
                                                   ("--queue-timeout", request.queue_timeout))
              if value is not None and not (option == "--gpu-model" and value == default_gpu_model)]
    return chosen + (["--cluster"] if request.cluster != "auto" else [])


def _is_class_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(name) <= 63 and set(name) <= allowed and name[0] != "-" and name[-1] != "-"


def _is_session_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return 0 < len(name) <= 63 and set(name) <= allowed


def gpu_models(value: str | None) -> tuple[str | None, tuple[str, ...]]:
    """``--gpu-model A100,H100``: the model to ask for, then the ones placement falls back to in this order
    when it has no room (``(None, ())`` for any model)."""
    models = split_names(value)
    return (models[0] if models else None), models[1:]


def split_names(value: str | None) -> tuple[str, ...]:
    """Split ``a,b , c`` into ``("a", "b", "c")``; empty items are dropped."""
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())
