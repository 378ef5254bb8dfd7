"""Arrays held in shared memory by a notebook variable go to the next cell without a copy, and never leak."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpu_offload.runner import buffers, lending


@pytest.fixture(autouse=True)
def young_heap() -> Iterator[None]:
    """``gc.collect()`` here looks only at what the test made: in a pytest process holding every module of the
    run, a full collection takes ~0.6 s (20 s for the 30-cell test, minutes under load); frozen objects are
    older than the test and hold none of its arrays."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def big(n: int = 300_000) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def came_back(tmp_path: Path, value: object) -> dict:
    """What the kernel holds after a cell returned ``value`` through shm."""
    dumped = buffers.dump(value, "shm", shm_dir=str(tmp_path))
    return buffers.load(dumped.pickle, dumped.buffers, hold=True)


def files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


def test_an_output_is_held_while_its_variable_lives_and_removed_with_it(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    (name,) = files(tmp_path)
    assert name.startswith(f"gpuo-held-{os.getpid()}-")
    assert os.stat(tmp_path / name).st_mode & 0o777 == 0o400
    view = out["a"][10:]  # a view keeps the memory, and so the file
    del out
    gc.collect()
    assert files(tmp_path) == [name]
    del view
    gc.collect()
    assert files(tmp_path) == []


def test_an_unchanged_held_array_is_lent_by_name_and_the_runner_cannot_change_it(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    (held,) = files(tmp_path)
    sent = buffers.dump({"a": out["a"]}, "shm", shm_dir=str(tmp_path))
    (ref,) = sent.buffers
    assert ref["lent"] is True and Path(ref["path"]).name == held
    assert files(tmp_path) == [held]  # no second file: nothing was copied
    inside = buffers.load(sent.pickle, sent.buffers, share=True)  # as the runner loads its inputs
    inside["a"] *= 2  # the cell changes its input in place
    np.testing.assert_array_equal(out["a"], big())  # the notebook's array did not change
    buffers.discard(sent.buffers)  # what both sides do with input references after a run
    assert files(tmp_path) == [held]


def test_a_lent_input_sent_back_unchanged_is_linked_not_copied(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    (held,) = files(tmp_path)
    sent = buffers.dump({"a": out["a"]}, "shm", shm_dir=str(tmp_path))
    inside = buffers.load(sent.pickle, sent.buffers, share=True)
    back = buffers.dump({"b": inside["a"]}, "shm", shm_dir=str(tmp_path))  # the cell did `b = a`
    (ref,) = back.buffers
    assert "lent" not in ref
    assert os.stat(ref["path"]).st_ino == os.stat(tmp_path / held).st_ino
    result = buffers.load(back.pickle, back.buffers, hold=True)
    np.testing.assert_array_equal(result["b"], big())


def test_an_array_the_notebook_changed_is_copied_with_its_change(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    out["a"][5] = -1.0
    sent = buffers.dump({"a": out["a"]}, "shm", shm_dir=str(tmp_path))
    (ref,) = sent.buffers
    assert "lent" not in ref
    inside = buffers.load(sent.pickle, sent.buffers, share=True)
    assert inside["a"][5] == -1.0
    inside["a"][6] = -2.0  # the runner's in-place change reaches neither the notebook nor the held file
    assert out["a"][6] == 6.0


def test_an_array_changed_in_the_runner_is_copied_back(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    sent = buffers.dump({"a": out["a"]}, "shm", shm_dir=str(tmp_path))
    inside = buffers.load(sent.pickle, sent.buffers, share=True)
    inside["a"][0] = 42.0
    back = buffers.dump({"b": inside["a"]}, "shm", shm_dir=str(tmp_path))
    (ref,) = back.buffers
    assert os.stat(ref["path"]).st_ino != os.stat(sent.buffers[0]["path"]).st_ino
    result = buffers.load(back.pickle, back.buffers)
    assert result["b"][0] == 42.0 and out["a"][0] == 0.0


def test_many_cells_leave_nothing_once_the_variables_are_gone(tmp_path: Path) -> None:
    namespace: dict = {}
    for i in range(30):
        namespace["a"] = came_back(tmp_path, {"a": big() + i})["a"]
        sent = buffers.dump({"a": namespace["a"]}, "shm", shm_dir=str(tmp_path))
        inside = buffers.load(sent.pickle, sent.buffers, share=True)
        back = buffers.dump({"b": inside["a"]}, "shm", shm_dir=str(tmp_path))
        namespace["b"] = buffers.load(back.pickle, back.buffers, hold=True)["b"]
        del inside, sent, back
        gc.collect()
        assert len(files(tmp_path)) <= 2
    namespace.clear()
    gc.collect()
    assert files(tmp_path) == []


def test_held_files_of_a_kernel_that_died_are_swept(tmp_path: Path) -> None:
    dead = tmp_path / "gpuo-held-999999999-00aa.buf"
    alive = tmp_path / f"gpuo-held-{os.getpid()}-00bb.buf"
    dead.write_bytes(b"x")
    alive.write_bytes(b"y")
    out = came_back(tmp_path, {"a": big()})
    assert not dead.exists() and alive.exists()
    del out


def test_pagemap_sees_a_write_under_copy_on_write(tmp_path: Path) -> None:
    out = came_back(tmp_path, {"a": big()})
    array = out["a"]
    start = array.__array_interface__["data"][0]
    assert lending.unchanged(start, array.nbytes)
    array[-1] = 0.5
    assert not lending.unchanged(start, array.nbytes)
