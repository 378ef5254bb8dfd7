"""Run records: what the panel shows about one offloaded run, and the state directory that shares them.

Every kernel of a user writes the records of its own runs as small JSON files in one state directory
(by default under Jupyter's runtime directory, which all kernels of one user server share), so a panel
in any notebook, and the server extension, see the runs of all the user's kernels without talking to
the kernels. A cancel request is a ``<run_id>.cancel`` file the owning kernel polls for.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ...liqo_peering import environment as E
from ...liqo_peering.settings import kernel_settings
from ...runner.watchdog import parent_alive
from ..timing import RunTiming, timing_from_json

STATE_DIR_ENV = E.STATE_DIR.name
STATES = ("queued", "scheduling", "running", "done", "failed")
"""What the panel shows as a run's state, in the order a run goes through them."""
FINISHED = frozenset({"done", "failed"})
MAX_LINES = 5
MAX_TAIL = 2000
MAX_SAMPLES = 60
KEEP_FINISHED = 50
"""Finished records kept per state directory (the oldest beyond this are pruned)."""
PRUNE_SLACK = 25
"""Records allowed beyond :data:`KEEP_FINISHED` before a prune parses the directory."""


@dataclass(frozen=True)
class RunEntry:
    """One offloaded run as the panel lists it."""

    run_id: str
    kernel: str
    """The Jupyter kernel id (or ``host-pid`` outside a kernel) that launched the run."""
    pid: int
    """Process id of that kernel, so a run of a kernel that died can be told from a live one."""
    backend: str
    cluster: str
    """``local``, a remote cluster id, or ``auto`` until placement is known."""
    gpus: int
    state: str = "queued"
    detail: str = ""
    """Why the run is in its state, in words (e.g. the pod's scheduling message, or ``cancelled``)."""
    session: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    tail: str = ""
    """The end of the run's output (its last :data:`MAX_TAIL` characters)."""
    util: tuple[float, ...] = ()
    """GPU utilization samples in percent (mean over the run's GPUs)."""
    mem: tuple[float, ...] = ()
    """GPU memory samples as a fraction of the total (summed over the run's GPUs)."""
    script: str | None = None
    """The command line of a ``gpu-offload run`` script; ``None`` for a notebook cell."""
    log: str = ""
    """A file holding the run's whole output (``gpu-offload run --noblock``), else empty."""
    timing: RunTiming | None = None
    """Where the wait from Shift-Enter went (:mod:`..timing`), once the run ended."""

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the run was queued, up to its end."""
        end = self.ended if self.ended is not None else (time.time() if now is None else now)
        return max(0.0, end - self.started)

    @property
    def finished(self) -> bool:
        """Whether the run is over."""
        return self.state in FINISHED


_FIELDS = tuple(f.name for f in fields(RunEntry))


def record_to_json(record: RunEntry) -> dict[str, Any]:
    """JSON-ready form (what the state files and the REST API hold).

    Built field by field: ``dataclasses.asdict`` deep-copies every value, which a warm cell cannot afford.
    """
    data = {name: getattr(record, name) for name in _FIELDS}
    data["util"], data["mem"] = list(record.util), list(record.mem)
    data["timing"] = None if record.timing is None else record.timing.to_json()
    return data


def record_from_json(data: Mapping[str, Any]) -> RunEntry:
    """A record back from :func:`record_to_json`; raises ``ValueError`` naming what does not fit."""
    known = {f.name for f in fields(RunEntry)}
    try:
        values = {k: v for k, v in data.items() if k in known}
        for name in ("util", "mem"):
            values[name] = tuple(values.get(name) or ())
        values["timing"] = timing_from_json(values.get("timing"))
        record = RunEntry(**values)
    except TypeError as exc:
        raise ValueError(f"run record {data.get('run_id', '?')!r} does not fit RunEntry: {exc}") from exc
    if record.state not in STATES:
        raise ValueError(f"run record {record.run_id!r} has unknown state {record.state!r}")
    return record


def add_output(tail: str, text: str, keep: int = MAX_TAIL) -> str:
    """The output tail with ``text`` appended, cut to its last ``keep`` characters."""
    return (tail + text)[-keep:]


def shown_lines(record: RunEntry, count: int = MAX_LINES) -> list[str]:
    """The last ``count`` lines of output; of a line rewritten with ``\\r`` (a progress bar) only its last state."""
    lines = record.tail.replace("\r\n", "\n").split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return [line.rsplit("\r", 1)[-1] for line in lines[-count:]]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id lives (a zombie counts as dead): the runner's own check."""
    return parent_alive(pid)


def default_state_dir() -> Path:
    """``$GPU_OFFLOAD_STATE_DIR`` as it is now, else ``gpu-offload-runs`` in Jupyter's runtime directory."""
    chosen = kernel_settings().state_dir
    if chosen:
        return Path(chosen)
    return _jupyter_runs()


@functools.cache
def _jupyter_runs() -> Path:
    """Looked up once per process: Jupyter's runtime directory is fixed when the kernel starts (its lookup,
    home directory and path resolution, cost every warm cell a tenth of a millisecond)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir()) / "gpu-offload-runs"


class StateDirRefused(OSError):
    """The state directory is not this user's alone; the message names it and the fix."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def check_state_dir(root: Path) -> None:
    """Create ``root`` (mode 0700) if missing; refuse one that is a symlink, another user's, or open to others.

    Anyone who can write into the directory could plant a symlink where a record is written (and have a
    file of this user's overwritten) or fake the records the panel shows.
    """
    if not os.path.lexists(root):
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = os.lstat(root)
    fix = f"remove it, or give it to this user with mode 0700 (chmod 700 {root}), or unset {STATE_DIR_ENV}"
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirRefused(f"run state directory {root} is not a directory (a symlink?); {fix}")
    if info.st_uid != os.geteuid():
        raise StateDirRefused(f"run state directory {root} belongs to uid {info.st_uid}, not to this user "
                              f"(uid {os.geteuid()}); {fix}")
    if info.st_mode & 0o077:
        raise StateDirRefused(f"run state directory {root} has mode {stat.S_IMODE(info.st_mode):o}, open to "
                              f"other users; {fix}")


class RunBook:
    """The state directory: one ``<run_id>.json`` per run, written atomically; cancel requests beside them.

    Nothing in it is followed through a symlink; temporary files get unguessable names and are created
    exclusively; the directory itself is checked (:func:`check_state_dir`) before the first use.
    """

    def __init__(self, root: Path | None = None) -> None:
        self._fixed = root
        self._checked: Path | None = None
        self._pin: RunBook | None = None
        self._kept: dict[str, int] = {}
        """Records :meth:`prune` read and had to keep (running, unreadable, another run's), by name, with their
        last write: not read again while unchanged."""

    @property
    def root(self) -> Path:
        """The directory given, else the setting as it is now: a kernel's book is made when the magic loads,
        and ``GPU_OFFLOAD_STATE_DIR`` set in the notebook afterwards still applies to its next run."""
        return self._fixed or default_state_dir()

    def pinned(self) -> RunBook:
        """This book at the directory the setting names now, for one run's writes: resolving the setting
        (environment, Jupyter's runtime directory) costs tens of microseconds, which a warm cell paid at each of
        its record's accesses. The same book while the directory stays the same (checked once)."""
        if self._fixed is not None:
            return self
        root = default_state_dir()
        if self._pin is None or self._pin.root != root:
            self._pin = RunBook(root)
        return self._pin

    def check(self) -> None:
        """Raise :class:`StateDirRefused` unless the directory is this user's alone (checked once per directory)."""
        root = self.root
        if self._checked != root:
            check_state_dir(root)
            self._checked = root

    def _path(self, run_id: str, suffix: str) -> Path:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"run id {run_id!r} is not a plain name; run ids come from the magic")
        return self.root / f"{run_id}{suffix}"

    def write(self, record: RunEntry) -> None:
        """Store ``record``; readers never see half a file (write to a temporary name, then rename)."""
        final = self._path(record.run_id, ".json")
        self.check()
        temp = final.with_name(f".{final.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(record_to_json(record)))
            os.replace(temp, final)  # a rename replaces a symlink at ``final``; it never writes through it
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise

    def read_all(self) -> tuple[list[RunEntry], list[str]]:
        """Every stored record, newest first, and the files that could not be read (named, never fatal).

        A run still marked active whose kernel process is gone is shown as failed.
        """
        records: list[RunEntry] = []
        problems: list[str] = []
        if not os.path.lexists(self.root):
            return records, problems
        try:
            self.check()
        except StateDirRefused as exc:
            return records, [str(exc)]
        for path in sorted(self.root.glob("*.json")):
            try:
                record = record_from_json(json.loads(_read_nofollow(path)))
            except FileNotFoundError:
                continue  # pruned or replaced while we listed
            except (ValueError, OSError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            if not record.finished and not pid_alive(record.pid):
                record = replace(record, state="failed", detail=f"its kernel (pid {record.pid}) is gone")
            records.append(record)
        records.sort(key=lambda r: r.started, reverse=True)
        return records, problems

    def request_cancel(self, run_id: str) -> None:
        """Ask the kernel that owns ``run_id`` to interrupt it (it polls while it follows the run)."""
        path = self._path(run_id, ".cancel")
        self.check()
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o600))

    def cancel_requested(self, run_id: str) -> bool:
        """Whether someone asked to cancel ``run_id``."""
        return os.path.lexists(self._path(run_id, ".cancel"))

    def forget_cancel(self, run_id: str) -> None:
        """Remove a handled cancel request."""
        with contextlib.suppress(FileNotFoundError):
            self._path(run_id, ".cancel").unlink()

    def prune(self, keep: int = KEEP_FINISHED, slack: int = PRUNE_SLACK) -> None:
        """Delete the oldest finished records beyond the newest ``keep`` once more than ``keep + slack`` files
        exist.

        Runs after finished runs, so it must cost next to nothing: counting directory entries is cheap, parsing
        every record is not (about 10 ms for 75 of them, which every 25th warm cell paid). Files are taken
        oldest first by their last write (a finished record's last write is its run's end) and only those
        beyond ``keep`` are read, each deleted only if it is finished (or its kernel is gone). One kept (a run
        of another kernel still under way) is not read again until it changes, nor counted towards the slack:
        a directory shared with long runs would otherwise be parsed again at every prune.
        """
        try:
            entries = [entry for entry in os.scandir(self.root) if entry.name.endswith(".json")]
        except FileNotFoundError:
            return
        if len(entries) <= keep + slack:
            return
        aged = []
        for entry in entries:
            with contextlib.suppress(OSError):  # pruned or replaced while we listed
                aged.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
        aged.sort()
        known = sum(1 for written, name in aged if self._kept.get(name) == written)
        if len(aged) - known <= keep + slack:
            return  # the excess is records an earlier prune read and kept: nothing new to delete yet
        kept = {}
        for written, name in aged[: max(0, len(aged) - keep)]:
            if self._kept.get(name) == written:
                kept[name] = written
                continue  # read by an earlier prune and kept; unchanged since
            record = self._read_one(self.root / name)
            if record is None or not record.finished:
                kept[name] = written
                continue  # unreadable (read_all names it) or still running: not this prune's to delete
            for suffix in (".json", ".cancel"):
                with contextlib.suppress(FileNotFoundError):
                    self._path(record.run_id, suffix).unlink()
            log = Path(record.log) if record.log else None
            if log is not None and log.parent == self.root:  # a background script's output goes with its record
                log.unlink(missing_ok=True)
        self._kept = kept

    def _read_one(self, path: Path) -> RunEntry | None:
        """One stored record as :meth:`read_all` shows it (a dead kernel's active run as failed); ``None`` if it
        cannot be read."""
        try:
            record = record_from_json(json.loads(_read_nofollow(path)))
        except (ValueError, OSError):
            return None
        if path.name != f"{record.run_id}.json":
            return None  # a file named for another run: deleting by its run id would hit that run's record
        if not record.finished and not pid_alive(record.pid):
            record = replace(record, state="failed", detail=f"its kernel (pid {record.pid}) is gone")
        return record


def _read_nofollow(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as handle:
        return handle.read()


def newest_first(records: Iterable[RunEntry]) -> list[RunEntry]:
    """Records sorted by start time, newest first; one per run id (the first seen wins)."""
    seen: dict[str, RunEntry] = {}
    for record in records:
        seen.setdefault(record.run_id, record)
    return sorted(seen.values(), key=lambda r: r.started, reverse=True)
