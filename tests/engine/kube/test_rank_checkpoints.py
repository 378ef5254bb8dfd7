"""kube/rank_checkpoints' pure builders: a distributed session's checkpoint is one object per rank and one record
naming all of them; each pod is sent only its own ranks' parts; a rank that did not change keeps its object; a
record the kernel does not accept is refused; a checkpoint goes back only into a session of its shape."""

from __future__ import annotations

import hashlib

import pytest

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.rank_checkpoints import (
    NOT_RESTORED_GROUP,
    combine,
    merged_parts,
    node_commands,
    restored_words,
    shape_refusal,
)
from gpu_offload.engine.errors import OffloadUsageError

TWO_BY_TWO = Ranks(nodes=2, procs_per_node=2)


def part(rank: int, sha: str, **more: object) -> dict[str, object]:
    return {"version": 1, "format": "pickle", "rank": rank, "size": 10 + rank, "sha256": sha, "saved": ["n"],
            "modules": {}, "skipped": {}, **more}


def test_each_node_is_sent_only_its_own_ranks_parts() -> None:
    parts = {r: {"put_url": f"url-{r}"} for r in range(4)}
    commands = node_commands({"op": "checkpoint", "limit": 5}, parts, TWO_BY_TWO)
    assert commands == {
        0: {"op": "checkpoint", "limit": 5, "per_rank": {"0": {"put_url": "url-0"}, "1": {"put_url": "url-1"}}},
        1: {"op": "checkpoint", "limit": 5, "per_rank": {"2": {"put_url": "url-2"}, "3": {"put_url": "url-3"}}},
    }


def test_the_record_names_every_rank_hashes_them_all_and_says_what_was_not_saved_on_which_rank() -> None:
    parts = [part(0, "a" * 64, saved=["arr", "n"], skipped={"guard": "_thread.lock: cannot pickle"}),
             part(1, "b" * 64, saved=["n"], skipped={"guard": "_thread.lock: cannot pickle", "f": "file: no"},
                  modules={"np": "numpy"})]
    manifest = combine(parts, Ranks(nodes=2, procs_per_node=1))
    assert manifest["ranks"] == parts and manifest["shape"] == {"nodes": 2, "procs_per_node": 1}
    assert (manifest["format"], manifest["size"], manifest["saved"]) == ("pickle", 21, ["arr", "n"])
    assert manifest["sha256"] == hashlib.sha256(("a" * 64 + "b" * 64).encode()).hexdigest()
    assert manifest["skipped"] == {"guard": "ranks 0, 1: _thread.lock: cannot pickle", "f": "rank 1: file: no"}
    assert manifest["modules"] == {"np": "numpy"}
    mixed = combine([part(0, "a" * 64), part(1, "b" * 64, format="safe")], Ranks(nodes=2, procs_per_node=1))
    assert mixed["format"] == "safe"  # never claimed a pickle unless every rank wrote one


def test_a_rank_that_did_not_change_keeps_its_object_and_a_record_not_its_own_is_refused() -> None:
    before = [part(0, "a" * 64), part(1, "b" * 64)]
    answers = {0: {"unchanged": True}, 1: part(1, "c" * 64)}
    parts, objs = merged_parts(answers, before, ["old-0", "old-1"], ["new-0", "new-1"], limit=100) or ([], [])
    assert objs == ["old-0", "new-1"] and parts == [before[0], part(1, "c" * 64)]
    assert merged_parts({0: {"unchanged": True}, 1: {"unchanged": True}}, before, ["o0", "o1"], ["n0", "n1"],
                        limit=100) is None
    for bad in (part(0, "c" * 64), part(1, "c" * 64, size=101), part(1, "c" * 64, format="exec"),
                {k: v for k, v in part(1, "c" * 64).items() if k != "sha256"}):
        with pytest.raises(OffloadUsageError, match="rank 1 answered with a checkpoint record this kernel does not"):
            merged_parts({0: part(0, "a" * 64), 1: bad}, [], [], ["n0", "n1"], limit=100)
    # a first checkpoint has nothing to keep: "unchanged" cannot stand for an object never written
    with pytest.raises(OffloadUsageError):
        merged_parts({0: {"unchanged": True}, 1: part(1, "c" * 64)}, [], [], ["n0", "n1"], limit=100)


def test_a_checkpoint_goes_back_only_into_a_session_of_its_shape() -> None:
    two = Ranks(nodes=2, procs_per_node=1)
    assert shape_refusal("ddp", two, Ranks(nodes=2, procs_per_node=1, out_rank=1), "ddp") is None
    assert shape_refusal("train", None, None, "train") is None
    assert shape_refusal("ddp", two, Ranks(nodes=4, procs_per_node=1), "big") == (
        "checkpoint ddp holds the states of 2 ranks (--nodes 2 --procs-per-node 1) and session big has --nodes 4 "
        "--procs-per-node 1; restore it into a session of the shape it was written with (--nodes 2 "
        "--procs-per-node 1): a state is not resharded onto another number of ranks")
    assert "holds one runner's state (one runner (no --nodes)) and session ddp has --nodes 2" in str(
        shape_refusal("train", None, two, "ddp"))
    assert "session one has one runner (no --nodes)" in str(shape_refusal("ddp", two, None, "one"))


def test_what_came_back_is_said_once_for_all_ranks_and_the_process_group_is_named() -> None:
    restored, skipped = restored_words({0: (["arr", "n"], {"guard": "lock"}), 1: (["n"], {"guard": "lock"})})
    assert restored == ["arr", "n"]
    assert skipped == {"guard": "ranks 0, 1: lock", "process group": NOT_RESTORED_GROUP}
