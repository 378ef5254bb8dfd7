"""Zero-copy return of input buffers: what a cell sends back unchanged (``b = a``) or changed in place
(``a *= 2``) is not copied again.

The runner maps its shm inputs *shared* and keeps their file names until the run ends. When an output
buffer is exactly one of those mappings (same address, same size), the file already holds the output's
bytes (a shared mapping writes through), so the runner gives it a second name with ``os.link`` and sends
that name: no copy. The engine may meanwhile delete the input's own name; the pages live on under the new
one. Then the runner remaps the same pages *private* at the same address (``MAP_FIXED``): the array in the
runner keeps its content, but a later in-place change (a warm session's next cell) no longer reaches the
file, so the notebook's copy can never change under it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import weakref

MAP_FIXED = 0x10  # Linux; Python's mmap module does not export it

_eligible: dict[tuple[int, int], str] = {}
_names: list[str] = []


def address(view: memoryview) -> int | None:
    """Start address of a writable buffer, ``None`` for one ctypes cannot see (read-only)."""
    import ctypes  # only runs that map shm inputs get here

    try:
        holder = ctypes.c_char.from_buffer(view)
    except (TypeError, ValueError):
        return None
    start = ctypes.addressof(holder)
    del holder  # releases the export, so the mapping can still be closed later
    return start


def map_shared(fd: int, size: int, path: str) -> memoryview:
    """Map an input file shared and writable, and remember it as a candidate for :func:`take`."""
    mapping = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
    view = memoryview(mapping)
    start = address(view)
    if start is not None:
        _eligible[(start, size)] = path
        # once this mapping is gone its address may be another's: a stale entry would send the wrong file
        weakref.finalize(mapping, _forget, (start, size), path)
    _names.append(path)
    return view


def _forget(key: tuple[int, int], path: str) -> None:
    if _eligible.get(key) == path:
        del _eligible[key]


def take(view: memoryview, directory: str) -> str | None:
    """A new name for the input file that *is* ``view``, or ``None`` (then the caller copies)."""
    start = address(view) if _eligible else None
    if start is None:
        return None
    source = _eligible.pop((start, view.nbytes), None)
    if source is None:
        return None
    target = os.path.join(directory, f"gpuo-{os.urandom(8).hex()}.buf")
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or the name is gone: copy instead
        return None
    if not _make_private(start, view.nbytes, source):
        os.unlink(target)
        return None
    return target


def _make_private(start: int, size: int, path: str) -> bool:
    """Replace the shared mapping at ``start`` by a private one of the same file: same bytes, no sharing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = mmap.MAP_PRIVATE | MAP_FIXED
        placed = libc.mmap(start, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    finally:
        os.close(fd)
    return bool(placed == start)


def release() -> None:
    """End of the run: drop the input files' names (mappings stay valid; handed-over files keep theirs)."""
    for path in _names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    _names.clear()
    _eligible.clear()
