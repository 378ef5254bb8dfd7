"""Arrays that stay in shared memory while a notebook variable holds them, so sending them again is free.

An output buffer reaches the kernel as a file on tmpfs mapped copy-on-write (``buffers``). Instead of
unlinking that file at once, the kernel *holds* it while the mapping lives: the file is renamed into the
kernel's own name space (``gpuo-held-<pid>-...``), made read-only, and unlinked when the mapping is garbage
collected (the variable and every view of it are gone) or the kernel exits. When the same array is an input
of a later cell and none of its pages was written since (the kernel's ``/proc/self/pagemap`` tells: a page
written under copy-on-write turns anonymous), it is *lent*: the runner gets the file's name and maps it
private, read-only to the file, and the bytes are never copied. A lent file that comes back unchanged
(``b = a``) is linked under a new name by the runner (``handover.take``), again without a copy.

Standard library only: this module also runs inside the runner's zipapp.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import weakref
from typing import Any

from .handover import address
from .watchdog import parent_alive  # whether a pid is a live process (a zombie kernel is gone too)

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PRESENT = 1 << 63
_SWAPPED = 1 << 62
_FILE = 1 << 61
_HELD = re.compile(r"^gpuo-held-(\d+)-[0-9a-f]+\.buf$")

_held: dict[tuple[int, int], str] = {}
"""(start address, size) of each held mapping -> its file."""
_lent_in_runner: dict[tuple[int, int], str] = {}
_swept: set[str] = set()


def unchanged(start: int, size: int) -> bool:
    """Whether no page of the private file mapping at ``start`` was written since it was mapped.

    A page of a MAP_PRIVATE file mapping is either not present or a page-cache page until written; a write
    copies it into an anonymous page (present, not a file page), and only anonymous pages are swapped.
    """
    first, last = start // PAGE, (start + size - 1) // PAGE
    count = last - first + 1
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return False  # no pagemap (not Linux): never lend, copy as before
    try:
        raw = os.pread(fd, count * 8, first * 8)
    finally:
        os.close(fd)
    if len(raw) != count * 8:
        return False
    for entry in memoryview(raw).cast("Q"):
        if entry & _SWAPPED or (entry & _PRESENT and not entry & _FILE):
            return False
    return True


def _drop(key: tuple[int, int], path: str) -> None:
    if _held.get(key) == path:
        del _held[key]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep(directory: str) -> None:
    """Remove held files of kernels that are gone (a crash skips their exit handler); once per directory."""
    if directory in _swept:
        return
    _swept.add(directory)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _HELD.match(name)
        if match and not parent_alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def hold(mapping: Any, path: str) -> None:
    """Keep ``path`` (the file ``mapping`` maps copy-on-write) until the mapping is collected."""
    directory = os.path.dirname(path)
    sweep(directory)
    start = address(mapping)
    if start is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    held = os.path.join(directory, f"gpuo-held-{os.getpid()}-{os.urandom(8).hex()}.buf")
    try:
        os.rename(path, held)
        os.chmod(held, 0o400)  # the kernel's data: no one opens it for writing by accident
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    key = (start, len(mapping))
    _held[key] = held
    weakref.finalize(mapping, _drop, key, held)


def _unchanged_file(files: dict[tuple[int, int], str], view: memoryview) -> str | None:
    """The file ``files`` names for the mapping that *is* ``view``, if no page of it changed since, or None."""
    if not files:
        return None
    start = address(view)
    if start is None:
        return None
    path = files.get((start, view.nbytes))
    if path is None or not unchanged(start, view.nbytes):
        return None
    return path


def lend(view: memoryview) -> str | None:
    """The held file that *is* ``view``, unchanged since it came, or None (then the caller copies)."""
    return _unchanged_file(_held, view)


def borrowed(mapping: Any, path: str) -> None:
    """Runner side: remember a lent input's private mapping, so an unchanged output can name it again."""
    start = address(mapping)
    if start is not None:
        key = (start, len(mapping))
        _lent_in_runner[key] = path
        # the address may later belong to another mapping: forget it with this one
        weakref.finalize(mapping, _forget_lent, key, path)


def _forget_lent(key: tuple[int, int], path: str) -> None:
    if _lent_in_runner.get(key) == path:
        del _lent_in_runner[key]


def give_back(view: memoryview, directory: str) -> str | None:
    """Runner side: a new name for the lent file that is ``view`` if the cell did not write it, else None."""
    source = _unchanged_file(_lent_in_runner, view)
    if source is None:
        return None
    target = os.path.join(directory, f"gpuo-{os.urandom(8).hex()}.buf")
    try:
        os.link(source, target)
    except OSError:
        return None
    return target


def held_files() -> list[str]:
    return sorted(_held.values())


@atexit.register
def _release_all() -> None:
    for path in list(_held.values()):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    _held.clear()
