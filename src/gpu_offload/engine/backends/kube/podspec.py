"""Outputs a runner uploaded to object storage, read back so the engine loads them without the network.

The runner pod itself is built by ``liqo_peering.specs.runner_pod`` (memory, GPUs, labels, security, and
the bootstrap that fetches a bundle too large for its Secret).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def same_object(url: str, presigned: str) -> bool:
    """Whether ``url`` names the object ``presigned`` does (the signature in the query differs per signing)."""
    from urllib.parse import urlsplit

    a, b = urlsplit(url), urlsplit(presigned)
    return (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)


def _refused(reason: str) -> dict[str, Any]:
    # a kind no loader reads: the engine reports the reason and loads nothing
    return {"kind": "refused", "reason": reason}


UNTRUSTED_STORED_MAX = 1 << 30
"""Most bytes an untrusted run's stored outputs may declare: what it could send inline (the frame decoder's
``MAX_EVENT_BYTES``)."""


def untrusted_unfetched(format_: str, outputs_pickle: Any, refs: Sequence[Mapping[str, Any]]) -> Any:
    """An untrusted run's ``outputs`` frame as it stays when nothing of it is to be downloaded, or ``None``
    when its one stored safe container may be fetched.

    The kernel will refuse a pickle or buffer references from an untrusted cluster unread, so they are
    never downloaded either; a container declared larger than :data:`UNTRUSTED_STORED_MAX` becomes a
    refusal saying so (the read itself is bounded by the declared size).
    """
    if format_ != "safe" or refs or not isinstance(outputs_pickle, Mapping):
        return outputs_pickle
    size = outputs_pickle.get("size")
    if outputs_pickle.get("kind") == "url" and (type(size) is not int or not 0 <= size <= UNTRUSTED_STORED_MAX):
        return _refused(f"they are stored as {str(size)[:40]} bytes, where an untrusted cluster may send back "
                        f"at most {UNTRUSTED_STORED_MAX} (1 GiB); nothing was downloaded")
    return None


def fetched_outputs(
    outputs_pickle: Any, refs: Sequence[Mapping[str, Any]], read: Callable[[Mapping[str, Any]], bytes],
    own: Callable[[int, str], bool],
) -> tuple[Any, list[Any]]:
    """The ``outputs`` frame's pickle and buffer refs with every ``url`` ref of this run's own uploads replaced
    by its bytes.

    ``read(ref)`` returns the bytes of the run's upload the ref names by its index (checked against the
    ref's sha256); ``own(index, url)`` says whether ``url`` is this
    run's upload ``index``. The pod wrote the refs, so a ref is never trusted to say where to read: a URL that
    is not the run's own, and any ``shm`` path (a pod never shares this machine's memory), is refused.
    """

    def fetch(ref: Mapping[str, Any]) -> Any:
        if not isinstance(ref, Mapping):
            return copy.deepcopy(ref)
        kind = ref.get("kind")
        if kind == "shm":
            return _refused("a runner pod named a file on the notebook's machine")
        if kind != "url":
            return copy.deepcopy(ref)
        index, url = ref.get("index"), ref.get("url")
        if type(index) is not int or not isinstance(url, str) or not own(index, url):
            return _refused("a runner pod named a URL that is not one of its run's uploads")
        data = read(ref)  # raises StorageError naming the object when it is missing or was changed
        return {"kind": "inline", "data": data, "size": len(data)}

    return fetch(outputs_pickle) if isinstance(outputs_pickle, Mapping) else outputs_pickle, [fetch(r) for r in refs]
