"""GPU metrics through NVML (pynvml, carried in the zipapp) while a cell runs.

NVML enumerates every GPU of the machine and ignores ``CUDA_VISIBLE_DEVICES``; the local backend selects
GPUs with that variable, so the same filter is applied here to report only the GPUs the cell can use.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

NO_GPU_NOTE = "no GPU visible, running on CPU"


def _nvml() -> Any:
    if not _driver_present():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver, no library, no device: all mean "no GPU here"
        return None


@functools.lru_cache(maxsize=1)
def _driver_present() -> bool:
    # the NVIDIA driver exposes /dev/nvidiactl (also inside GPU containers); without it there is no GPU
    # to see, and the cold start skips ctypes and pynvml altogether
    if os.name == "posix" and not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")):
        return False
    import ctypes

    # loading the driver's library is the first thing NVML does; trying it first spares importing
    # pynvml (a large module) when the library is missing
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def visible_handles() -> list[tuple[int, Any]]:
    """(index, NVML handle) of the GPUs the cell may use; empty without a driver or GPU."""
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:
        return []
    selector = os.environ.get("CUDA_VISIBLE_DEVICES")
    if selector is None:
        return handles
    return [(i, h) for i, h in handles if _selected(i, _uuid(nvml, h), selector.split(","))]


def _uuid(nvml: Any, handle: Any) -> str:
    try:
        uuid = nvml.nvmlDeviceGetUUID(handle)
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    except Exception:
        return ""


def _selected(index: int, uuid: str, wanted: Sequence[str]) -> bool:
    for item in (w.strip() for w in wanted):
        if item.isdigit() and int(item) == index:
            return True
        if item.startswith("GPU-") and uuid.startswith(item):
            return True
    return False


def gpu_names() -> list[str]:
    """Names of the visible GPUs, for the ``hello`` frame."""
    handles = visible_handles()
    if not handles:
        return []
    import pynvml

    return [str(_read(pynvml.nvmlDeviceGetName, h) or "unknown GPU") for _, h in handles]


def sample(handles: Sequence[tuple[int, Any]]) -> list[dict[str, Any]]:
    """One reading per GPU; a value NVML cannot give is ``None``."""
    import pynvml

    readings = []
    for index, handle in handles:
        memory = _read(pynvml.nvmlDeviceGetMemoryInfo, handle)
        utilization = _read(pynvml.nvmlDeviceGetUtilizationRates, handle)
        temp = _read(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
        power = _read(pynvml.nvmlDeviceGetPowerUsage, handle)
        readings.append(
            {
                "index": index,
                "name": _read(pynvml.nvmlDeviceGetName, handle) or "unknown GPU",
                "util": None if utilization is None else float(utilization.gpu),
                "mem_used": None if memory is None else int(memory.used),
                "mem_total": None if memory is None else int(memory.total),
                "temp": None if temp is None else float(temp),
                "power": None if power is None else power / 1000.0,  # NVML reports milliwatts
            }
        )
    return readings


def _read(getter: Callable[..., Any], *args: Any) -> Any:
    try:
        value = getter(*args)
    except Exception:  # e.g. power readings are not supported on every board
        return None
    return value.decode() if isinstance(value, bytes) else value


class Sampler:
    """Emits ``metrics`` at each tick of the run's :class:`~.ticker.Ticker` (every ``metrics_interval`` seconds)."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self._emit = emit
        self.note_sent = False

    def task(self) -> Callable[[], None] | None:
        """This run's sampling of the visible GPUs; without a GPU, None, and the note said once per runner."""
        handles = visible_handles()
        if handles:
            return functools.partial(self._sample, handles)
        if not self.note_sent:
            self._emit("metrics", gpu=[], note=NO_GPU_NOTE)
            self.note_sent = True
        return None

    def _sample(self, handles: list[tuple[int, Any]]) -> None:
        self._emit("metrics", gpu=sample(handles))
