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
        if self.session is not None and not _is_session_name(self.session):
            raise OffloadUsageError(
                f"--session {self.session!r}: a session name uses letters, digits, '-', '_' or '.' "
                "(up to 63 characters), e.g. --session train."
            )


def _is_session_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return 0 < len(name) <= 63 and set(name) <= allowed


def split_names(value: str | None) -> tuple[str, ...]:
    """Split ``a,b , c`` into ``("a", "b", "c")``; empty items are dropped."""
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())
