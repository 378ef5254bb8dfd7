"""The panel in real kernels, checked on the widget models a frontend receives: rows appear, runs of
another kernel show up live, cancel stops a run as Ctrl-C would, closing the panel stops its thread."""

from __future__ import annotations

import re
from typing import Any

PANEL = "get_ipython().magics_manager.registry['GpuOffloadMagics'].last_panel"
MAGIC = "get_ipython().magics_manager.registry['GpuOffloadMagics']"
RUN_IDS = "[r.run_id for r in __import__('gpu_offload.engine.runs.tracking', fromlist=['x']).tracker().records()]"


def _state_of(kernel: Any, run_id: str) -> str | None:
    for value in kernel.html():
        if run_id[:12] in value and "gpu-offload-state" in value:
            found = re.search(r'gpu-offload-state"[^>]*>(\w+)<', value)
            return found.group(1) if found else None
    return None


def test_the_panel_cell_returns_at_once_with_the_local_row_and_how_to_add_a_cluster(kernels: Any) -> None:
    panel_kernel, _ = kernels
    reply, text = panel_kernel.run("%gpu_offload panel")
    assert reply["status"] == "ok", (reply, text)
    # the cell is over while the panel's thread keeps it current
    assert panel_kernel.value(f"{PANEL}.thread.is_alive()") is True
    panel_kernel.wait_for(lambda: any("this machine" in v for v in panel_kernel.html()), "the local row")
    assert any("No cluster is configured" in v and "GPU_OFFLOAD_NAMESPACE" in v for v in panel_kernel.html())
    local = panel_kernel.buttons()[panel_kernel.button("run the next cells on local")]
    assert local["description"] == "✓ default"  # the kernel's backend is local


def test_a_run_in_another_kernel_appears_with_its_output_and_ends_done(kernels: Any) -> None:
    panel_kernel, other = kernels
    reply, text = other.run("%%gpu_offload\nprint('hello from the other kernel')")
    assert reply["status"] == "ok", (reply, text)
    run_id = other.value(RUN_IDS)[-1]
    panel_kernel.wait_for(lambda: _state_of(panel_kernel, run_id) == "done", f"run {run_id} shown as done")
    assert any("hello from the other kernel" in v for v in panel_kernel.html())


def test_cancel_in_the_panel_stops_a_foreground_cell_of_another_kernel_as_ctrl_c(kernels: Any) -> None:
    panel_kernel, other = kernels
    reply, _ = other.run("x = 'before'")
    pending = other.start("%%gpu_offload\nimport time\nx = 'after'\nprint('started', flush=True)\ntime.sleep(300)")
    panel_kernel.wait_for(lambda: any("started" in v for v in panel_kernel.html()), "the run's first line")
    run_id = other_run = None
    for comm_id, model in panel_kernel.buttons().items():
        if (model.get("tooltip") or "").startswith("stop run") and not model.get("disabled"):
            run_id, other_run = model["tooltip"].split()[2], comm_id
    assert run_id is not None and other_run is not None
    assert _state_of(panel_kernel, run_id) == "running"
    panel_kernel.click(other_run)
    reply, text = other.finish(pending)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", (reply, text)
    assert "started" in text
    assert other.value("x") == "before"  # as after Ctrl-C: nothing copied back
    panel_kernel.wait_for(lambda: _state_of(panel_kernel, run_id) == "failed", "the cancelled run shown as failed")
    assert any(run_id[:12] in v and "cancelled" in v for v in panel_kernel.html())
    # the row's cancel button is disabled once the run is over
    panel_kernel.wait_for(lambda: panel_kernel.buttons()[other_run].get("disabled"), "cancel disabled")


def test_cancel_in_the_panel_stops_a_noblock_run_of_its_own_kernel(kernels: Any) -> None:
    panel_kernel, _ = kernels
    reply, text = panel_kernel.run("%%gpu_offload --noblock\nimport time\nprint('busy', flush=True)\ntime.sleep(300)")
    assert reply["status"] == "ok", (reply, text)
    run_id = panel_kernel.value(f"{MAGIC}.last_handle.run_id")
    button = panel_kernel.wait_for(
        lambda: _state_of(panel_kernel, run_id) == "running" and panel_kernel.button(f"stop run {run_id}"),
        "the noblock run shown running")
    panel_kernel.click(button)
    assert panel_kernel.value(f"{MAGIC}.last_handle.wait(60) and {MAGIC}.last_handle.status") == "cancelled"
    reply, text = panel_kernel.run(f"{MAGIC}.last_handle.result()")
    assert reply["ename"] == "KeyboardInterrupt", (reply, text)
    panel_kernel.wait_for(lambda: _state_of(panel_kernel, run_id) == "failed", "the cancelled run shown as failed")


def test_choosing_a_row_sets_the_default_of_the_next_cells(kernels: Any) -> None:
    panel_kernel, _ = kernels
    reply, text = panel_kernel.run("%gpu_offload config backend=kubernetes default_cluster=donor-b")
    assert reply["status"] == "ok", (reply, text)
    panel_kernel.click(panel_kernel.button("run the next cells on local"))
    panel_kernel.pump(1.0)
    assert panel_kernel.value(f"[{MAGIC}.backend, {MAGIC}.default_cluster]") == ["local", "auto"]
    reply, text = panel_kernel.run("%%gpu_offload\nprint('on the chosen backend')")
    assert reply["status"] == "ok" and "on the chosen backend" in text, (reply, text)


def test_closing_the_panel_stops_its_thread_and_removes_its_widgets(kernels: Any) -> None:
    panel_kernel, _ = kernels
    shown = ("HTMLModel", "ButtonModel", "VBoxModel", "HBoxModel")
    before = {k for k, m in panel_kernel.live().items() if m.get("_model_name") in shown}
    panel_kernel.click(panel_kernel.button("close panel"))
    panel_kernel.pump(1.0)
    assert panel_kernel.value(f"{PANEL}.thread.is_alive()") is False
    names = panel_kernel.value("[t.name for t in __import__('threading').enumerate()]")
    assert "gpu-offload-panel" not in names
    panel_kernel.wait_for(lambda: before <= panel_kernel.closed,
                          f"every widget of the panel closed: {[panel_kernel.models[k] for k in before - panel_kernel.closed]}")


def test_the_panel_function_shows_a_panel_and_close_stops_it(kernels: Any) -> None:
    panel_kernel, _ = kernels
    reply, text = panel_kernel.run("from gpu_offload.magics import panel\np2 = panel(interval=0.5)")
    assert reply["status"] == "ok", (reply, text)
    assert panel_kernel.value("p2.thread.is_alive()") is True
    reply, text = panel_kernel.run("p2.close()")
    assert reply["status"] == "ok", (reply, text)
    assert panel_kernel.value("[p2.thread.is_alive(), p2.closed]") == [False, True]
