"""The one line every benchmark prints first, so figures from different runs can be compared."""

from __future__ import annotations

import os
import platform


def machine_line() -> str:
    """CPU model, cores, memory, kernel, Python and the load average at the time of the call."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"machine: {model}, {os.cpu_count()} cores, {memory:.0f} GiB, {platform.system()} {platform.release()} "
        f"{platform.machine()}, Python {platform.python_version()}, load average {load}"
    )
