"""A small live plot of a run's GPU utilization and memory: an inline SVG, so it needs no plotting library
in the kernel and no extension in the browser."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH = 160
HEIGHT = 36


def _points(values: Sequence[float], top: float) -> str:
    step = WIDTH / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{HEIGHT - min(max(v, 0.0), top) / top * (HEIGHT - 2) - 1:.1f}" for i, v in enumerate(values)
    )


def sparkline(util: Sequence[float], mem: Sequence[float], note: str = "", live: bool = True) -> str:
    """SVG with utilization (percent, blue) and memory (fraction of total, orange); when there is none, a note,
    and while the run is ``live`` "no GPU metrics yet" (an ended run without samples shows nothing)."""
    if not util and not mem:
        if not note and not live:
            return ""
        text = escape(note or "no GPU metrics yet")
        return f'<span class="gpu-offload-noplot" style="color:var(--jp-ui-font-color2, #888);font-size:11px">{text}</span>'
    title = escape(
        f"GPU {util[-1]:.0f}% busy" if util else "GPU"
    ) + (escape(f", memory {mem[-1] * 100:.0f}% used") if mem else "")
    lines = []
    if util:
        lines.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{_points(util, 100.0)}"/>')
    if mem:
        lines.append(f'<polyline fill="none" stroke="#ff7f0e" stroke-width="1.5" points="{_points(mem, 1.0)}"/>')
    return (
        f'<svg class="gpu-offload-plot" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'style="background:var(--jp-layout-color2, #f7f7f7);border:1px solid var(--jp-border-color2, #ddd)"><title>{title}</title>{"".join(lines)}</svg>'
        f'<div style="font-size:10px;color:var(--jp-ui-font-color1, #555)">{title}</div>'
    )
