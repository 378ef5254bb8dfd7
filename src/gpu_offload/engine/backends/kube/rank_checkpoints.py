"""Checkpoints of a distributed session (``--session NAME --nodes N``): one object per rank, one record naming all.

Each rank is a session runner of its own namespace, so each writes its own state to its own presigned URL; the
kernel's record (a :class:`~.checkpoints.KubeCheckpoint` with ``rank_objs``) keeps every rank's manifest (its
size and sha256, what it saved and did not) under ``ranks`` and, on top, what :func:`combine` makes of them: the
format, the size of all, one sha256 over the ranks' (so the record as a whole is hashed too), the names saved and
not (with the ranks they concern). Rank ``r``'s state goes back into rank ``r`` of a session of the same shape,
never another shape: the project has no rule to reshard a distributed state, so a checkpoint of 2 ranks is
restored only into 2 ranks (:func:`shape_refusal`).

Pure builders first (:func:`node_commands`, :func:`combine`, :func:`merged_parts`, :func:`shape_refusal`,
:func:`restored_words`), then the one exchange with the session's pods (:func:`exchange_ranks`): a command to
every node's launcher (each gets only its own ranks' parts: its URLs), and each rank's answer read from the
pod that runs it, as a single session's :func:`~.checkpoints.exchange` reads one pod's.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ....runner import checkpoint
from ....runner.frames import Hello, Status
from ...errors import OffloadUsageError
from ...timing import Phase
from .. import checkpoint_book as book
from ..base import Placed, Ranks
from ..checkpoint_book import SessionLost
from .follow import PodEnded

EXCHANGE_TIMEOUT = 600.0
START_TIMEOUT = 1800.0
WAIT_STEP = 0.2
"""Seconds between looks at whether every pod of the session runs."""
NOT_RESTORED_GROUP = ("the process group and what holds it were not restored (they live in the ranks' processes): "
                      "call dist.init_process_group() again, and wrap the model again, before a collective")


class RankHolder(Protocol):
    """What a distributed session offers the exchange: its name, shape, pods and a way to each pod's stdin."""

    name: str
    ranks: Ranks
    nodes: Any
    """The session's :class:`~.jobrun.JobPods`."""
    dead: bool

    def send_each(self, commands: Mapping[int, dict[str, Any]]) -> int | None: ...


def shape_words(ranks: Ranks | None) -> str:
    """A shape as the options that ask for it."""
    if ranks is None:
        return "one runner (no --nodes)"
    return f"--nodes {ranks.nodes} --procs-per-node {ranks.procs_per_node}"


def shape_refusal(name: str, written: Ranks | None, target: Ranks | None, session: str) -> str | None:
    """Why checkpoint ``name``, written by a session of shape ``written``, cannot go into session ``session`` of
    shape ``target`` (``None``: it can). Rank r's state goes back into rank r: another number of ranks would need
    a rule to reshard it, which the project does not have."""
    same = (written is None and target is None) or (
        written is not None and target is not None
        and (written.nodes, written.procs_per_node) == (target.nodes, target.procs_per_node))
    if same:
        return None
    held = "one runner's state" if written is None else f"the states of {written.world_size} ranks"
    return (f"checkpoint {name} holds {held} ({shape_words(written)}) and session {session} has "
            f"{shape_words(target)}; restore it into a session of the shape it was written with "
            f"({shape_words(written)}): a state is not resharded onto another number of ranks")


def node_commands(common: Mapping[str, Any], parts: Mapping[int, Mapping[str, Any]],
                  ranks: Ranks) -> dict[int, dict[str, Any]]:
    """One command per node: ``common`` and, under ``per_rank``, the parts of that node's ranks only (a launcher
    passes its line to each of its ranks, which takes its own part; no pod gets another pod's URLs)."""
    per_node = range(ranks.procs_per_node)
    return {node: {**common, "per_rank": {str(r): dict(parts[r]) for r in
                                          (node * ranks.procs_per_node + i for i in per_node) if r in parts}}
            for node in range(ranks.nodes)}


def checked_part(manifest: Mapping[str, Any], rank: int, limit: int) -> dict[str, Any]:
    """Rank ``rank``'s manifest as the kernel keeps it; :class:`OffloadUsageError` when it is not one the kernel
    accepts (a known format, its own rank, a size within the limit, a sha256)."""
    size = manifest.get("size")
    if (manifest.get("format") not in checkpoint.FORMATS or manifest.get("rank") != rank or type(size) is not int
            or not 0 <= size <= limit or not isinstance(manifest.get("sha256"), str)):
        raise OffloadUsageError(f"rank {rank} answered with a checkpoint record this kernel does not accept "
                                "(format, its rank, size within the limit, sha256); nothing was recorded")
    return dict(manifest)


def merged_parts(answers: Mapping[int, Mapping[str, Any]], before: Sequence[Mapping[str, Any]],
                 before_objs: Sequence[str], new_objs: Sequence[str],
                 limit: int) -> tuple[list[dict[str, Any]], list[str]] | None:
    """Every rank's manifest and object after a checkpoint: a rank that answered ``unchanged`` keeps its part of
    ``before`` (its object too), the others their new one. ``None`` when no rank changed."""
    parts: list[dict[str, Any]] = []
    objs: list[str] = []
    changed = False
    for rank in range(len(new_objs)):
        answer = answers[rank]
        if answer.get("unchanged") and rank < len(before) and rank < len(before_objs):
            parts.append(dict(before[rank]))
            objs.append(before_objs[rank])
            continue
        changed = True
        parts.append(checked_part({k: v for k, v in answer.items() if k != "unchanged"}, rank, limit))
        objs.append(new_objs[rank])
    return (parts, objs) if changed else None


def combine(parts: Sequence[Mapping[str, Any]], ranks: Ranks) -> dict[str, Any]:
    """The one manifest of a distributed checkpoint: every rank's manifest under ``ranks``, and what they hold
    together (what ``describe`` and the notes read). Its ``sha256`` is the hash of the ranks' hashes in rank
    order, so the record as a whole is hashed; each object is still checked against its own."""
    formats = {p.get("format") for p in parts}
    saved = sorted({str(n) for p in parts for n in p.get("saved", [])})
    skipped: dict[str, dict[str, list[int]]] = {}
    for rank, part in enumerate(parts):
        for name, why in dict(part.get("skipped") or {}).items():
            skipped.setdefault(str(name), {}).setdefault(str(why), []).append(rank)
    modules = {str(k): str(v) for p in parts for k, v in dict(p.get("modules") or {}).items()}
    digest = hashlib.sha256("".join(str(p.get("sha256")) for p in parts).encode("ascii")).hexdigest()
    return {
        "version": 1,
        "format": formats.pop() if len(formats) == 1 else checkpoint.SAFE,
        "saved": saved,
        "modules": modules,
        "skipped": {name: "; ".join(f"{_ranks_text(on)}: {why}" for why, on in whys.items())
                    for name, whys in skipped.items()},
        "size": sum(int(p.get("size", 0)) for p in parts),
        "sha256": digest,
        "shape": {"nodes": ranks.nodes, "procs_per_node": ranks.procs_per_node},
        "ranks": [dict(p) for p in parts],
    }


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


def restored_words(answers: Mapping[int, tuple[list[str], dict[str, str]]]) -> tuple[list[str], dict[str, str]]:
    """What the ranks' restores brought back, together: the names restored (each into its own rank), and those
    that were not with the ranks and the reason; the process group is named as not restored."""
    restored = sorted({n for names, _ in answers.values() for n in names})
    whys: dict[str, dict[str, list[int]]] = {}
    for rank in sorted(answers):
        for name, why in answers[rank][1].items():
            whys.setdefault(name, {}).setdefault(why, []).append(rank)
    skipped = {name: "; ".join(f"{_ranks_text(on)}: {why}" for why, on in by.items()) for name, by in whys.items()}
    skipped["process group"] = NOT_RESTORED_GROUP
    return restored, skipped


# --- the exchange with the session's pods ---

def wait_nodes_running(holder: RankHolder, timeout: float = START_TIMEOUT) -> float:
    """Wait until every pod's launcher runs; returns the seconds waited. :class:`SessionLost` if a pod ended."""
    started = time.monotonic()
    nodes = holder.nodes
    while True:
        nodes.discover()
        if nodes.all_running:
            return time.monotonic() - started
        ended = [f.name for f in nodes.followers.values() if f.ended]
        if ended:
            raise SessionLost(f"the session's pod {ended[0]} ended")
        if holder.dead:
            raise SessionLost(f"session {holder.name} was closed")
        if time.monotonic() - started > timeout:
            raise SessionLost(f"the pods of session {holder.name} did not all start within {timeout:.0f} s")
        time.sleep(WAIT_STEP)


def exchange_ranks(holder: RankHolder, common: Mapping[str, Any], parts: Mapping[int, Mapping[str, Any]],
                   timeout: float = EXCHANGE_TIMEOUT) -> dict[int, dict[str, Any]]:
    """Send a checkpoint command to every rank (its own part) and read each rank's answer, by rank."""
    wait_nodes_running(holder)
    nodes, ranks = holder.nodes, holder.ranks
    run_id = "ckpt-" + secrets.token_hex(8)
    for follower in nodes.followers.values():
        follower.expect_run(run_id)
    commands = node_commands({**common, "run_id": run_id}, parts, ranks)
    lost = holder.send_each(commands)
    if lost is not None:
        raise SessionLost(f"could not attach to pod {nodes.followers[lost].name} of session {holder.name}")
    kept: list[tuple[int, Any]] = []
    try:
        return _answers(holder, str(common["op"]), timeout, kept)
    finally:
        for index, item in kept:  # where the pods run and their phases are the session's next cell's to show
            nodes.followers[index].events.put(item)


def _answers(holder: RankHolder, op: str, timeout: float, kept: list[tuple[int, Any]]) -> dict[int, dict[str, Any]]:
    nodes, ranks = holder.nodes, holder.ranks
    answers = {r: book.Answer(op, f"rank {r} of session {holder.name}") for r in range(ranks.world_size)}
    payloads: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(payloads) < ranks.world_size:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = ", ".join(str(r) for r in range(ranks.world_size) if r not in payloads)
            raise OffloadUsageError(f"rank(s) {missing} of session {holder.name} did not answer {op} within "
                                    f"{timeout:.0f} s")
        got = nodes.next(min(left, 1.0))
        if got is None:
            continue
        index, item = got
        if isinstance(item, PodEnded):
            nodes.ended.discard(index)
            kept.append((index, item))  # the session's next cell says how it ended
            raise SessionLost(f"the session's pod {nodes.followers[index].name} ended: {item.state.text}")
        if isinstance(item, Hello | Status | Placed | Phase):
            kept.append((index, item))
            continue
        rank = getattr(item, "rank", None)
        # a rank's answer counts only from the pod that runs it: a pod cannot answer for another's ranks
        if not isinstance(rank, int) or rank // ranks.procs_per_node != index or rank in payloads:
            continue
        payload = answers[rank].take(item)
        if payload is not None:
            payloads[rank] = payload
    return payloads


__all__ = ["NOT_RESTORED_GROUP", "RankHolder", "checked_part", "combine", "exchange_ranks", "merged_parts",
           "node_commands", "restored_words", "shape_refusal", "shape_words", "wait_nodes_running"]
