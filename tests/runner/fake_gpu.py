"""A GPU for a cell to allocate on, on a machine without one.

The runner reads the GPU memory it holds from ``gpu_watch.SOURCES`` (torch's allocator, NVML). A cell that
starts with :func:`prelude` adds one more source to the runner it runs in: a GPU of ``total_gib`` whose memory
the cell takes with ``gpu_alloc(gib)``. Everything else (the watch, the stop, the frames, what the notebook
shows) is the runner's and the engine's own code.
"""

from __future__ import annotations


def prelude(total_gib: float = 80) -> str:
    """Cell text that plugs a GPU of ``total_gib`` into the runner and defines ``gpu_alloc(gib)``."""
    return (
        "import sys as _sys\n"
        "import importlib as _importlib\n"
        "_runner = next(n for n in list(_sys.modules) if n.endswith('runner.runtime')).rsplit('.', 1)[0]\n"
        "_watch = _importlib.import_module(_runner + '.gpu_watch')\n"
        "_held = [0]\n"
        f"_watch.SOURCES.append(lambda: _watch.Reading(_held[0], int({total_gib} * 2**30)))\n"
        "def gpu_alloc(gib):\n"
        "    _held[0] += int(gib * 2**30)\n"
    )
