"""The memory a training cell needs, estimated on no GPU, against what a real training step allocates."""

from __future__ import annotations

import ctypes
import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from gpu_offload.engine.estimate import (  # noqa: E402
    CONTEXT,
    GIB,
    MARGIN,
    MIB,
    PeakBook,
    PeakRecord,
    cell_key,
    estimate_training_step,
    out_of_memory_advice,
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def _in_use() -> int:
    """Bytes the C allocator has handed out and not had back (heap and mmapped blocks)."""
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


class _MallocPeak(TorchDispatchMode):
    """Samples the C allocator around every operation of a real CPU step: an instrument independent of the
    estimator's tensor accounting (it sees every byte malloc hands out, tensors or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = _in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.peak = max(self.peak, _in_use())
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, _in_use())
        return out


def _training(build, batch, optimizer):
    torch.manual_seed(0)
    model = build()
    x = batch()
    opt = optimizer(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    return step


def measured_cpu_peak(build, batch, optimizer) -> int:
    """Peak bytes a real steady training step holds on the CPU, parameters and batch included.

    A discarded first step sets up what a process does once and keeps: torch's lazy start-up, oneDNN's kernels
    compiled for these shapes and its primitive cache, thread pools (46 MiB for whichever case ran first in the
    process, 16 MiB more the first time a convolution ran). That is the process's, not the step's; on a GPU its
    counterpart is the CUDA context, which the request adds apart (``CONTEXT``)."""
    _training(build, batch, optimizer)()
    before = _in_use()
    step = _training(build, batch, optimizer)
    step()
    with _MallocPeak() as probe:
        step()
    return probe.peak - before


def mlp():
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


def convnet():
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 16 * 16, 10))


def encoder():
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), 2)


CASES = {
    "mlp-adam": (mlp, lambda: torch.randn(256, 512), torch.optim.Adam),
    "mlp-wide-batch-sgd": (mlp, lambda: torch.randn(4096, 512), torch.optim.SGD),
    "convnet-adamw": (convnet, lambda: torch.randn(32, 3, 32, 32), torch.optim.AdamW),
    "convnet-wide-batch-sgd": (convnet, lambda: torch.randn(128, 3, 32, 32), torch.optim.SGD),
    "encoder-adam": (encoder, lambda: torch.randn(16, 64, 256), torch.optim.Adam),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_estimate_is_within_20_percent_of_a_real_training_steps_peak(case):
    build, batch, optimizer = CASES[case]
    measured = measured_cpu_peak(build, batch, optimizer)
    estimate = estimate_training_step(build(), batch(), optimizer)
    assert abs(estimate.peak - measured) <= 0.20 * measured, (case, estimate.peak / MIB, measured / MIB)
    assert estimate.parameters + estimate.optimizer_state <= estimate.peak


def test_the_estimate_counts_adams_two_states_per_parameter_and_leaves_the_model_alone():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    estimate = estimate_training_step(model, torch.randn(8, 512), torch.optim.Adam)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert estimate.parameters == params
    assert estimate.optimizer_state == 2 * params
    assert all(p.device.type == "cpu" and torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_a_larger_batch_needs_more_memory_and_the_request_says_so():
    small = estimate_training_step(mlp(), torch.randn(64, 512))
    large = estimate_training_step(mlp(), torch.randn(8192, 512))
    # at least the two hidden layers' extra activations (8128 more rows of 2048 floats, each kept for backward)
    assert large.peak - small.peak >= 2 * (8192 - 64) * 2048 * 4
    assert large.parameters == small.parameters and large.optimizer_state == small.optimizer_state
    assert large.request() > small.request()
    assert "optimizer state" in large.describe()


def test_the_second_estimate_for_a_cell_is_its_recorded_peak_plus_the_stated_margin(tmp_path):
    book = PeakBook(tmp_path / "peaks.json")
    key = cell_key("model.fit(x)", {"x": (256, 512)})
    assert book.recorded(key) is None
    book.record(key, PeakRecord(peak=3 * GIB, gpu_model="A100"))
    again = book.recorded(key)
    assert again is not None and again.source == "measured"
    expected = math.ceil((3 * GIB * (1 + MARGIN) + CONTEXT) / (256 * MIB)) * 256 * MIB
    assert again.request() == expected
    assert book.recorded(cell_key("model.fit(x)", {"x": (512, 512)})) is None  # other shapes: another cell


def test_a_damaged_peak_book_is_ignored_not_trusted(tmp_path):
    path = tmp_path / "peaks.json"
    path.write_text('{"k": {"peak": "lots"}, "j": {"peak": -5}')
    assert PeakBook(path).recorded("k") is None
    path.write_text('{"k": {"peak": "lots"}, "j": {"peak": -5}}')
    assert PeakBook(path).recorded("k") is None and PeakBook(path).recorded("j") is None


def test_out_of_memory_advice_says_what_it_had_and_what_to_ask_for():
    text = out_of_memory_advice(had=8 * GIB, peak=10 * GIB)
    assert "8.00 GiB" in text and "--gpu-memory 12Gi" in text
