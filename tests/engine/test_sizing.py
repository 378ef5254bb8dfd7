"""``--estimate``: the memory a cell asks for comes from its model before its first run, and from its recorded
peak plus the stated margin after one."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gpu_offload.engine.errors import OffloadUsageError  # noqa: E402
from gpu_offload.engine.estimate import CONTEXT, GIB, MARGIN, ROUND, PeakBook, estimate_training_step  # noqa: E402
from gpu_offload.engine.request import OffloadRequest  # noqa: E402
from gpu_offload.engine.sizing import oom_advice, record_peak, size  # noqa: E402

CELL = "for _ in range(3):\n    opt.zero_grad()\n    model(batch).pow(2).mean().backward()\n    opt.step()"


def _notebook() -> dict:
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return {"model": model, "batch": torch.zeros(64, 256), "opt": torch.optim.SGD(model.parameters(), lr=0.1)}


def test_the_first_estimate_comes_from_the_model_and_the_second_from_the_recorded_peak(tmp_path) -> None:
    namespace, book = _notebook(), PeakBook(tmp_path / "peaks.json")
    request = OffloadRequest(cell=CELL, estimate=True)
    first = size(request, ("model", "batch", "opt"), namespace, book)
    expected = estimate_training_step(namespace["model"], namespace["batch"], torch.optim.SGD, {"lr": 0.1})
    assert first.request.gpu_memory == expected.request()
    assert first.notice.startswith("asking for ") and "(estimate: peak" in first.notice
    peak = 3 * GIB
    assert record_peak(book, first.key, peak)
    second = size(request, ("model", "batch", "opt"), namespace, book)
    stated = math.ceil((peak * (1 + MARGIN) + CONTEXT) / ROUND) * ROUND
    assert second.request.gpu_memory == stated and "(measured: peak 3.00 GiB" in second.notice
    namespace["batch"] = torch.zeros(128, 256)  # other shapes: another cell as far as the book is concerned
    third = size(request, ("model", "batch", "opt"), namespace, book)
    assert third.key != first.key and "(estimate: peak" in third.notice


def test_a_cell_without_a_model_is_told_what_to_pass(tmp_path) -> None:
    with pytest.raises(OffloadUsageError, match=r"--estimate: the cell reads no torch.nn.Module .*--gpu-memory 12Gi"):
        size(OffloadRequest(cell="y = x + 1", estimate=True), ("x",), {"x": 1}, PeakBook(tmp_path / "p.json"))


def test_a_memory_the_user_gave_wins_and_is_only_explained(tmp_path) -> None:
    request = OffloadRequest(cell=CELL, estimate=True, gpu_memory=40 * GIB)
    sized = size(request, ("model", "batch", "opt"), _notebook(), PeakBook(tmp_path / "p.json"))
    assert sized.request.gpu_memory == 40 * GIB and sized.notice.startswith("the cell asked for --gpu-memory")


def test_out_of_memory_names_what_it_had_and_what_to_ask_for() -> None:
    advice = oom_advice("OutOfMemoryError", 8 * GIB, 9 * GIB)
    assert advice is not None and "it had 8.00 GiB, it reached 9.00 GiB" in advice and "--gpu-memory 11Gi" in advice
    assert oom_advice("ValueError", 8 * GIB, None) is None


def test_a_training_cell_without_estimate_is_told_what_it_needs_and_asks_as_it_said(tmp_path) -> None:
    from gpu_offload.engine.sizing import advise

    namespace, book = _notebook(), PeakBook(tmp_path / "peaks.json")
    request = OffloadRequest(cell=CELL)
    advice = advise(request, ("model", "batch", "opt"), namespace, lambda: book)
    assert advice is not None and advice.request is request  # the cell still asks for what it asked
    expected = estimate_training_step(namespace["model"], namespace["batch"], torch.optim.SGD, {"lr": 0.1})
    assert advice.notice == (f"this cell trains a torch model and needs {expected.describe()}; it asks for 1 whole "
                             "GPU: --estimate asks for just what it needs")
    assert record_peak(book, advice.key, 3 * GIB)  # its measured peak is kept, and said the next time
    again = advise(request, ("model", "batch", "opt"), namespace, lambda: book)
    assert again is not None and "(measured: peak 3.00 GiB" in again.notice
    half = advise(OffloadRequest(cell=CELL, gpus=1, fraction=0.5), ("model", "batch", "opt"), namespace, lambda: book)
    assert half is not None and "it asks for 0.5 of a GPU:" in half.notice


def test_no_advice_without_training_a_model_from_the_inputs_or_when_the_estimate_fails(tmp_path) -> None:
    from gpu_offload.engine.sizing import advise

    namespace, book = _notebook(), PeakBook(tmp_path / "peaks.json")
    inputs = ("model", "batch", "opt")
    assert advise(OffloadRequest(cell="y = model(batch)"), inputs, namespace, lambda: book) is None  # no backward
    assert advise(OffloadRequest(cell=CELL, estimate=True), inputs, namespace, lambda: book) is None  # size() does
    assert advise(OffloadRequest(cell=CELL), ("batch", "opt"), namespace, lambda: book) is None  # no model read

    class Broken(nn.Module):
        def forward(self, x):
            raise RuntimeError("needs data")

    namespace["model"] = Broken()
    assert advise(OffloadRequest(cell=CELL), inputs, namespace, lambda: book) is None  # never stops the cell
