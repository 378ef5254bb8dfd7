"""Values across the boundary: out-of-band buffers through shm, inline and presigned-style URLs."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from gpu_offload.runner import buffers


def big(n: int = 300_000) -> np.ndarray:
    return np.arange(n, dtype=np.float64)


def test_shm_round_trip_maps_without_copying_and_unlinks(tmp_path: Path) -> None:
    value = {"a": big(), "note": "small stays in band"}
    dumped = buffers.dump(value, "shm", shm_dir=str(tmp_path))
    assert [ref["kind"] for ref in dumped.buffers] == ["shm"]
    assert dumped.buffers[0]["size"] == value["a"].nbytes
    assert len(dumped.pickle) < 1000  # the array's bytes are not in the pickle
    loaded = buffers.load(dumped.pickle, dumped.buffers)
    assert list(tmp_path.iterdir()) == []  # the reader unlinked the file after mapping it
    np.testing.assert_array_equal(loaded["a"], value["a"])
    assert loaded["note"] == "small stays in band"
    # zero copy: the array's memory is the mapping itself, and it is writable (copy-on-write)
    owner = loaded["a"]
    while isinstance(owner, np.ndarray):
        owner = owner.base
    assert isinstance(owner, memoryview) and isinstance(owner.obj, mmap.mmap)
    loaded["a"][0] = -1.0
    assert value["a"][0] == 0.0


def test_a_failed_dump_writes_nothing(tmp_path: Path) -> None:
    value = {"a": big(), "gen": (x for x in range(3))}
    with pytest.raises(TypeError, match="generator"):
        buffers.dump(value, "shm", shm_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_inline_keeps_everything_in_the_pickle(tmp_path: Path) -> None:
    dumped = buffers.dump({"a": big()}, "inline")
    assert dumped.buffers == ()
    np.testing.assert_array_equal(buffers.load(dumped.pickle, [])["a"], big())


def test_a_missing_shm_file_names_the_path_and_unlinks_the_others(tmp_path: Path) -> None:
    dumped = buffers.dump([big(), big() + 1], "shm", shm_dir=str(tmp_path))
    first, second = dumped.buffers
    Path(second["path"]).unlink()
    with pytest.raises(buffers.BufferTransportError, match=second["path"]):
        buffers.load(dumped.pickle, dumped.buffers)
    assert not Path(first["path"]).exists()


def test_a_truncated_shm_file_is_refused(tmp_path: Path) -> None:
    dumped = buffers.dump(big(), "shm", shm_dir=str(tmp_path))
    Path(dumped.buffers[0]["path"]).write_bytes(b"short")
    with pytest.raises(buffers.BufferTransportError, match="5 bytes"):
        buffers.load(dumped.pickle, dumped.buffers)


def test_a_large_main_pickle_travels_as_a_reference(tmp_path: Path) -> None:
    value = [f"item {i}" for i in range(20_000)]  # no out-of-band buffers, but a big pickle
    dumped = buffers.dump(value, "shm", shm_dir=str(tmp_path))
    packed = buffers.pack_main(dumped.pickle, "shm", shm_dir=str(tmp_path))
    assert isinstance(packed, dict) and packed["kind"] == "shm"
    assert buffers.load_packed(packed, buffers.json_refs(dumped.buffers)) == value
    small = buffers.pack_main(buffers.dump(1).pickle, "shm", shm_dir=str(tmp_path))
    assert isinstance(small, str) and buffers.load_packed(small, []) == 1
    assert list(tmp_path.iterdir()) == []


def test_url_transport_puts_and_gets(store: str) -> None:
    urls = [f"{store}/bucket/buf-{i}?sig=ok" for i in range(3)]
    value = {"a": big(), "b": big() * 2}
    dumped = buffers.dump(value, "url", urls=urls)
    assert [ref["index"] for ref in dumped.buffers] == [0, 1]
    loaded = buffers.load(dumped.pickle, buffers.json_refs(dumped.buffers))
    np.testing.assert_array_equal(loaded["b"], value["b"])
    assert loaded["b"].flags.writeable


def test_url_errors_hide_the_signature_and_say_what_to_check(store: str) -> None:
    with pytest.raises(buffers.BufferTransportError) as failure:
        buffers.dump({"a": big()}, "url", urls=[f"{store}/bucket/x?sig=secret-token"])
    assert "secret-token" not in str(failure.value)
    assert "/bucket/x" in str(failure.value) and "expired" in str(failure.value)


def test_too_few_urls_is_an_error_naming_the_count(store: str) -> None:
    with pytest.raises(buffers.BufferTransportError, match="1 URL"):
        buffers.dump([big(), big()], "url", urls=[f"{store}/bucket/only?sig=ok"])


def test_unknown_transport_names_the_choices() -> None:
    with pytest.raises(ValueError, match="shm, inline, url"):
        buffers.dump(1, "carrier-pigeon")


def test_a_url_buffer_replaced_by_another_writer_is_refused(store: str) -> None:
    import hashlib
    import urllib.request

    data = bytes(range(256)) * 1000
    ref = buffers.write_buffer(memoryview(data), "url", 0, urls=[f"{store}/bucket/swap-0?sig=ok"])
    assert ref["sha256"] == hashlib.sha256(data).hexdigest()  # recorded by the writer
    assert bytes(buffers.read_buffer(ref)) == data
    urllib.request.urlopen(urllib.request.Request(f"{store}/bucket/swap-0?sig=ok", data=b"x" * len(data),
                                                  method="PUT")).close()
    with pytest.raises(buffers.BufferTransportError, match="another writer of the bucket"):
        buffers.read_buffer(ref)
