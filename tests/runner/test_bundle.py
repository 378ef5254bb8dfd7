"""The bundle a cell travels in: what it carries of the cell's inputs."""

from __future__ import annotations

import pickle
from pathlib import Path

from gpu_offload.runner.bundle import encode_bundle, make_bundle, parse_bundle
from gpu_offload.runner.execute import load_inputs


def test_a_cell_without_inputs_carries_no_pickle_and_loads_nothing(tmp_path: Path) -> None:
    empty = parse_bundle(encode_bundle(make_bundle("x = 1", shm_dir=str(tmp_path))))
    assert empty["inputs"] is None and empty["buffers"] == []
    namespace = {"kept": 1}
    load_inputs(lambda *a, **k: None, empty, namespace)
    assert namespace == {"kept": 1}
    full = parse_bundle(encode_bundle(make_bundle("y = x", inputs={"x": 2}, shm_dir=str(tmp_path))))
    assert pickle.loads(full["inputs"]) == {"x": 2}
    load_inputs(lambda *a, **k: None, full, namespace)
    assert namespace == {"kept": 1, "x": 2}
