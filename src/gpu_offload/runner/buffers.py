"""Values across the engine/runner boundary: cloudpickle protocol 5 with large buffers out of band.

Both sides use it: the engine dumps the cell's inputs and loads its outputs, the runner does the reverse.
A dump gives the main pickle plus a list of *buffer references* (plain dicts, JSON-safe apart from inline
``data``), one per large buffer (a numpy array's memory, say), moved by one of three transports:

- ``shm``: a file on tmpfs (``/dev/shm``); written with one copy, mapped copy-on-write by the reader (no
  copy, and the array comes back writable), and unlinked by the reader right after mapping.
- ``inline``: the bytes travel inside the pickle (for log-only channels); no references at all.
- ``url``: HTTP PUT to presigned URLs (object storage), read back with GET; standard library only.

Standard library plus cloudpickle only: this module also runs inside the runner's zipapp.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import mmap
import os
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from . import handover, lending

TRANSPORTS = ("shm", "inline", "url")
MIN_OUT_OF_BAND = 64 * 1024
"""Buffers smaller than this stay inside the pickle: a file or request per small buffer costs more."""
URL_TIMEOUT = 600.0

Ref = Mapping[str, Any]


class BufferTransportError(RuntimeError):
    """A buffer could not be written or read; the message names the buffer, the cause and what to do."""


class Dumped(NamedTuple):
    """A value ready to travel: the main pickle and references to its out-of-band buffers.

    A NamedTuple, not a frozen dataclass: importing dataclasses (and inspect with it) costs a cold runner
    about 10 ms of CPU before its hello."""

    pickle: bytes
    buffers: tuple[dict[str, Any], ...]


def default_shm_dir() -> str:
    """``/dev/shm`` where it exists (memory, not disk), else the temp directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    import tempfile

    return tempfile.gettempdir()


def dump(
    obj: Any,
    transport: str = "shm",
    *,
    shm_dir: str | None = None,
    urls: Sequence[str] = (),
    reducer: Callable[[Any], Any] | None = None,
    min_out_of_band: int = MIN_OUT_OF_BAND,
) -> Dumped:
    """Pickle ``obj`` (cloudpickle, protocol 5) and ship its large buffers through ``transport``.

    ``reducer`` is an extra ``reducer_override`` (return ``NotImplemented`` to pass). Nothing is written
    to the transport unless pickling succeeds, so a failed dump leaves no file behind.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown buffer transport {transport!r}; use one of {', '.join(TRANSPORTS)}")
    views: list[pickle.PickleBuffer] = []

    def keep(buffer: pickle.PickleBuffer) -> bool:
        # returning True keeps the buffer inside the pickle
        if transport == "inline" or buffer.raw().nbytes < min_out_of_band:
            return True
        views.append(buffer)
        return False

    main = _pickle(obj, keep, reducer)
    refs: list[dict[str, Any]] = []
    try:
        for index, view in enumerate(views):
            refs.append(write_buffer(view.raw(), transport, index, shm_dir=shm_dir, urls=urls))
    except BaseException:
        discard(refs)
        raise
    finally:
        for view in views:
            view.release()
    return Dumped(main, tuple(refs))


def _pickle(
    obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool], reducer: Callable[[Any], Any] | None
) -> bytes:
    out = io.BytesIO()
    _pickler(out, buffer_callback, reducer).dump(obj)
    return out.getvalue()


def _pickler(
    out: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool], reducer: Callable[[Any], Any] | None
) -> Any:
    pickler = _pickler_class()(out, protocol=5, buffer_callback=buffer_callback)
    pickler.extra_reducer = reducer
    return pickler


@functools.lru_cache(maxsize=1)
def _pickler_class() -> Any:
    # cloudpickle (and its imports: logging, typing, platform, ...) is a third of a runner's cold start;
    # a cell that sends nothing back never needs it (loading finds it through the pickle by itself)
    import cloudpickle

    class Pickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        extra_reducer: Callable[[Any], Any] | None = None

        def reducer_override(self, obj: Any) -> Any:
            if self.extra_reducer is not None:
                reduced = self.extra_reducer(obj)
                if reduced is not NotImplemented:
                    return reduced
            return super().reducer_override(obj)

    return Pickler


def pickling_error(obj: Any, reducer: Callable[[Any], Any] | None = None) -> Exception | None:
    """Why ``obj`` cannot be pickled, or ``None`` if it can; large buffers are skipped, not copied."""
    try:
        _pickler(_Sink(), lambda _: False, reducer).dump(obj)
    except Exception as exc:
        return exc
    return None


class _Sink:
    def write(self, data: Any) -> int:
        return len(data)


def write_buffer(
    view: memoryview, transport: str, index: int, *, shm_dir: str | None = None, urls: Sequence[str] = ()
) -> dict[str, Any]:
    """Write one buffer through ``transport`` and return its reference."""
    if transport == "shm":
        lent = lending.lend(view)
        if lent is not None:
            # the reader maps it private and leaves the name: it belongs to a variable of the notebook's
            return {"kind": "shm", "path": lent, "size": view.nbytes, "lent": True}
        directory = shm_dir or default_shm_dir()
        path = handover.take(view, directory) or lending.give_back(view, directory) or _write_shm(view, directory)
        return {"kind": "shm", "path": path, "size": view.nbytes}
    if transport == "url":
        if index >= len(urls):
            raise BufferTransportError(
                f"buffer {index} has no upload URL: {len(urls)} URL(s) were given for more buffers; "
                "pass one presigned PUT URL per out-of-band buffer (plus one for a large main pickle)"
            )
        _put(urls[index], view)
        # the reader checks it: anyone else who can write to the bucket could replace the object meanwhile
        digest = _sha256(view)
        return {"kind": "url", "url": urls[index], "size": view.nbytes, "index": index, "sha256": digest}
    return {"kind": "inline", "data": bytes(view)}


def _write_shm(view: memoryview, directory: str) -> str:
    import tempfile  # not at module level: a runner that sends no buffer back never needs it

    try:
        fd, path = tempfile.mkstemp(prefix="gpuo-", suffix=".buf", dir=directory)
    except OSError as exc:
        raise BufferTransportError(
            f"cannot create a buffer file in {directory}: {exc.strerror}; shm_dir must be an existing, "
            "writable directory shared by the notebook and the runner (normally /dev/shm)"
        ) from exc
    try:
        # one copy straight from the object's memory into tmpfs pages; write() avoids a page fault per
        # 4 KiB that filling a fresh mapping would cost
        data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        done = 0
        while done < data.nbytes:
            done += os.write(fd, data[done:])
    except BaseException as exc:
        os.close(fd)
        os.unlink(path)
        if isinstance(exc, OSError):
            raise BufferTransportError(
                f"cannot write a {view.nbytes}-byte buffer to {directory}: {exc.strerror}; "
                "free space there (df -h), or choose another shm_dir"
            ) from exc
        raise
    os.close(fd)
    return path


def _put(url: str, view: memoryview) -> None:
    import urllib.error
    import urllib.request  # only the url transport needs it, and it costs a cold start 0.1 s

    request = urllib.request.Request(
        url,
        data=view.cast("B") if view.ndim != 1 or view.format != "B" else view,
        method="PUT",
        headers={"Content-Type": "application/octet-stream", "Content-Length": str(view.nbytes)},
    )
    try:
        with urllib.request.urlopen(request, timeout=URL_TIMEOUT) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise BufferTransportError(
            f"upload of a {view.nbytes}-byte buffer to {_safe(url)} failed: {exc}; "
            "check that the presigned URL has not expired and the storage endpoint is reachable"
        ) from exc


def _sha256(view: memoryview) -> str:
    import hashlib  # only the url transport needs it

    return hashlib.sha256(view.cast("B")).hexdigest()


def _safe(url: str) -> str:
    # a presigned URL's query string is a credential: never put it in an error message
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


# ---------------------------------------------------------------------------------------------------------
# Loading


def load(
    data: bytes | bytearray | memoryview,
    refs: Iterable[Ref],
    *,
    share: bool = False,
    keep: bool = False,
    hold: bool = False,
) -> Any:
    """Unpickle ``data`` with the buffers ``refs`` point at; shm files are unlinked whatever happens.

    ``share`` (the runner) maps shm files shared and keeps their names until :func:`handover.release`, so
    outputs that are these very buffers go back without a copy. ``keep`` (the ranks of a distributed run,
    which all read the same files) maps them copy-on-write and leaves their names to the writer. ``hold``
    (the kernel, loading a cell's outputs) keeps each shm file while its mapping lives, so the array can be
    lent to a later cell without a copy (:mod:`.lending`).
    """
    pending = list(refs)
    buffers: list[Any] = []
    try:
        for position, ref in enumerate(pending):
            buffers.append(read_buffer(ref, share=share, keep=keep, hold=hold))
            pending[position] = {}
    finally:
        if not keep:
            discard([ref for ref in pending if ref])
    return pickle.loads(data, buffers=buffers)


def read_buffer(ref: Ref, share: bool = False, keep: bool = False, hold: bool = False) -> Any:
    """Return a writable buffer for ``ref`` (a copy-on-write mapping for shm: no copy is made)."""
    kind = ref.get("kind")
    if kind == "shm":
        if ref.get("lent") is True and share:
            return _map_lent(str(ref["path"]), int(ref["size"]))
        return _map_shm(str(ref["path"]), int(ref["size"]), share, keep, hold)
    if kind == "inline":
        raw = ref["data"]
        return bytearray(base64.b64decode(raw) if isinstance(raw, str) else raw)
    if kind == "url":
        url = str(ref.get("get_url") or ref["url"])
        data = _get(url, int(ref["size"]))
        if "sha256" in ref and _sha256(memoryview(data)) != ref["sha256"]:
            raise BufferTransportError(
                f"the object at {_safe(url)} is not the one its writer uploaded (its sha256 differs): another "
                "writer of the bucket replaced it; limit who may write there and run the cell again"
            )
        return data
    raise BufferTransportError(
        f"buffer reference {dict(ref)!r} has unknown kind {kind!r}; expected shm, inline or url "
        "(engine and runner must come from the same package version)"
    )


def _map_lent(path: str, size: int) -> Any:
    """A lent input: mapped private (the cell's in-place changes stay in the runner), its name left alone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise BufferTransportError(
            f"shared-memory buffer {path} lent by the notebook cannot be opened: {exc.strerror}; the notebook "
            "and the runner must share /dev/shm; run the cell again"
        ) from exc
    try:
        if os.fstat(fd).st_size != size:
            raise BufferTransportError(f"shared-memory buffer {path} is not {size} bytes; run the cell again")
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    lending.borrowed(mapping, path)
    return memoryview(mapping)


def _map_shm(path: str, size: int, share: bool = False, keep: bool = False, hold: bool = False) -> Any:
    if size == 0:
        if not keep:
            _unlink(path)
        return bytearray()
    try:
        fd = os.open(path, os.O_RDWR if share else os.O_RDONLY)
    except OSError as exc:
        raise BufferTransportError(
            f"shared-memory buffer {path} cannot be opened: {exc.strerror}; the writer and reader must "
            "share /dev/shm (same machine, or the same tmpfs mount) and each buffer is read only once"
        ) from exc
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise BufferTransportError(
                f"shared-memory buffer {path} holds {actual} bytes, its reference says {size}; "
                "the file was changed or truncated after writing: run the cell again"
            )
        if share:
            return handover.map_shared(fd, size, path)
        # ACCESS_COPY maps MAP_PRIVATE: pages are shared with tmpfs until written, so loading costs no
        # copy and arrays come back writable without touching the writer's data
        mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        if hold:
            lending.hold(mapping, path)
            path = ""  # the name is the held mapping's now
        return memoryview(mapping)
    finally:
        os.close(fd)
        if path and not (share or keep):
            _unlink(path)


def _get(url: str, size: int) -> bytearray:
    import urllib.error
    import urllib.request

    out = bytearray(size)
    view = memoryview(out)
    try:
        with urllib.request.urlopen(url, timeout=URL_TIMEOUT) as response:
            done = 0
            while done < size:
                got = response.readinto(view[done:])
                if not got:
                    break
                done += got
    except (urllib.error.URLError, OSError) as exc:
        raise BufferTransportError(
            f"download of a {size}-byte buffer from {_safe(url)} failed: {exc}; "
            "check that the presigned URL has not expired and the storage endpoint is reachable"
        ) from exc
    if done != size:
        raise BufferTransportError(
            f"download from {_safe(url)} ended after {done} of {size} bytes; the upload was incomplete: "
            "run the cell again"
        )
    return out


def discard(refs: Iterable[Ref]) -> None:
    """Remove shm files of references that will never be read (a failed or abandoned transfer)."""
    for ref in refs:
        # a lent file belongs to a notebook variable, which removes it when it is collected
        if ref.get("kind") == "shm" and ref.get("lent") is not True:
            _unlink(str(ref["path"]))


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# ---------------------------------------------------------------------------------------------------------
# The main pickle inside an ``outputs`` frame: inline base64, or a reference when it is large


def pack_main(
    main: bytes, transport: str, *, shm_dir: str | None = None, urls: Sequence[str] = (), index: int = 0
) -> Any:
    """What goes in an ``outputs`` frame's ``pickle`` field: base64 text, or a buffer reference."""
    if transport == "inline" or len(main) < MIN_OUT_OF_BAND:
        return base64.b64encode(main).decode("ascii")
    return write_buffer(memoryview(main), transport, index, shm_dir=shm_dir, urls=urls)


def load_packed(packed: Any, refs: Sequence[Ref], *, hold: bool = False) -> Any:
    """Load the value of an ``outputs`` frame from its ``pickle`` and ``buffers`` fields (``hold``: see
    :func:`load`; the main pickle is never held)."""
    if isinstance(packed, str):
        return load(base64.b64decode(packed), refs, hold=hold)
    try:
        main = read_buffer(packed)
    except BaseException:
        discard(refs)
        raise
    return load(main, refs, hold=hold)


def json_refs(refs: Iterable[Ref]) -> list[dict[str, Any]]:
    """References as JSON-safe dicts (inline bytes become base64 text, which :func:`read_buffer` accepts)."""
    out = []
    for ref in refs:
        item = dict(ref)
        if isinstance(item.get("data"), (bytes, bytearray)):
            item["data"] = base64.b64encode(item["data"]).decode("ascii")
        out.append(item)
    return out
