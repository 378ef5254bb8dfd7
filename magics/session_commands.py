"""``%gpu_offload checkpoint|restore|move``: a session's state written out, and a session started from it.

``checkpoint SESSION [--as NAME] [--limit MIB] [--auto on|off]`` writes the session's state (checkpoint
``NAME``, by default the session's name; ``--auto on``: again in the background after every cell that ends ok); ``restore NAME [--session S]`` starts session ``S`` (by default the one the checkpoint
came from) from it; ``move SESSION [--cluster C | --gpu-model M]`` checkpoints, closes and restores the session
in a new runner (on the kubernetes backend, placed on cluster ``C`` or a GPU of model ``M``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..engine.errors import OffloadUsageError

USAGE = ("%gpu_offload checkpoint SESSION [--as NAME] [--limit MIB] [--auto on|off], %gpu_offload restore NAME [--session S], "
         "%gpu_offload move SESSION [--cluster C | --gpu-model M]")


class Checkpointing(Protocol):
    """A backend whose sessions can be checkpointed and restored."""

    def checkpoint_session(self, name: str, checkpoint: str, limit: int | None = None,
                           auto: bool | None = None) -> Any: ...

    def restore_session(self, checkpoint: str, session: str | None = None) -> str: ...

    def close_session(self, name: str, grace: float = 5.0) -> bool: ...


def _options(command: str, words: list[str], allowed: Iterable[str]) -> tuple[str, dict[str, str]]:
    allowed = set(allowed)
    positional: list[str] = []
    options: dict[str, str] = {}
    rest = iter(words)
    for word in rest:
        if word.startswith("--"):
            value = next(rest, None)
            if word not in allowed or value is None:
                known = ", ".join(sorted(allowed)) or "none"
                raise OffloadUsageError(f"%gpu_offload {command}: {word} is not an option here or lacks its "
                                        f"value (options: {known}). Usage: {USAGE}")
            options[word] = value
        else:
            positional.append(word)
    if len(positional) != 1:
        raise OffloadUsageError(f"%gpu_offload {command}: name one session or checkpoint. Usage: {USAGE}")
    return positional[0], options


def _limit(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if mib <= 0:
        raise OffloadUsageError(f"--limit {text}: give the checkpoint limit in MiB, a positive number")
    return int(mib * 2**20)


def _checkpointing(backends: Iterable[Any], session: str | None = None) -> Checkpointing:
    """The backend that holds ``session`` (else the first one that checkpoints sessions)."""
    able = [backend for backend in backends if hasattr(backend, "checkpoint_session")]
    for backend in able:
        if session is not None and any(info.name == session for info in backend.sessions()):
            return backend  # type: ignore[no-any-return]
    if able:
        return able[0]  # type: ignore[no-any-return]
    raise OffloadUsageError("no backend of this kernel checkpoints sessions yet: run a cell with --session first")


def checkpoint(backends: Iterable[Any], words: list[str]) -> str:
    """``checkpoint SESSION``; returns what the user is told (what was saved, what was not, size and limit)."""
    session, options = _options("checkpoint", words, ("--as", "--limit", "--auto"))
    auto = options.get("--auto")
    if auto not in (None, "on", "off"):
        raise OffloadUsageError(f"--auto {auto}: write --auto on or --auto off")
    saved = _checkpointing(backends, session).checkpoint_session(session, options.get("--as", session),
                                                        _limit(options.get("--limit")),
                                                        None if auto is None else auto == "on")
    said = f"checkpoint {saved.describe()}"
    if auto is not None:
        said += ("\nfrom now on written again in the background after every cell that ends ok"
                 if auto == "on" else "\nno longer written after every cell")
    return said


def restore(backends: Iterable[Any], words: list[str]) -> str:
    """``restore NAME [--session S]``; returns what was restored and what was not."""
    name, options = _options("restore", words, ("--session",))
    return _checkpointing(backends).restore_session(name, options.get("--session"))


def move(backends: Iterable[Any], words: list[str], grace: float) -> list[str]:
    """``move SESSION [--cluster C | --gpu-model M]``: checkpoint, close, restore in a new runner (on a cluster,
    placed as asked); returns the lines for the user."""
    session, options = _options("move", words, ("--cluster", "--gpu-model"))
    backend = _checkpointing(backends, session)
    if hasattr(backend, "move_session"):
        return list(backend.move_session(session, options.get("--cluster"), options.get("--gpu-model"), grace))
    if options:
        raise OffloadUsageError("%gpu_offload move --cluster/--gpu-model: the local backend has no clusters; it "
                                "moves a session to a new runner (drop the option)")
    saved = backend.checkpoint_session(session, session)
    lines = [f"checkpoint {saved.describe()}"]
    backend.close_session(session, grace)
    lines.append(backend.restore_session(session, session))
    return lines
