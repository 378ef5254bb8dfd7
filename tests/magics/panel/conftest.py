"""Fixtures for the panel: real kernels sharing one state directory, and a mirror of their widget models
built from the comm messages a frontend would receive."""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")


@dataclass
class WidgetKernel:
    """A real kernel, and the widget models its iopub messages describe (comm id -> state)."""

    manager: Any
    client: Any
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)

    def _take(self, msg: dict[str, Any]) -> None:
        content = msg["content"]
        if msg["msg_type"] == "comm_open" and content.get("target_name") == "jupyter.widget":
            self.models[content["comm_id"]] = dict(content["data"].get("state") or {})
        elif msg["msg_type"] == "comm_msg" and content["comm_id"] in self.models:
            data = content["data"]
            if data.get("method") == "update":
                self.models[content["comm_id"]].update(data.get("state") or {})
        elif msg["msg_type"] == "comm_close":
            self.closed.add(content["comm_id"])

    def pump(self, seconds: float = 0.2) -> None:
        """Read whatever iopub has now (widget updates come from the panel's thread at any time)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            try:
                msg = self.client.get_iopub_msg(timeout=max(0.01, left))
            except queue.Empty:
                return
            self._take(msg)
            if left <= 0:
                return

    def start(self, code: str) -> str:
        """Send ``code`` without waiting for it."""
        return str(self.client.execute(code))

    def finish(self, msg_id: str, timeout: float = 120) -> tuple[dict[str, Any], str]:
        """Wait for the reply of ``msg_id``; returns it and the stdout+stderr the cell wrote."""
        text = []
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=timeout)
            except queue.Empty as exc:
                raise AssertionError(f"no message from the kernel within {timeout} s") from exc
            self._take(msg)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text.append(msg["content"]["text"])
            if msg["msg_type"] == "error":
                text.append("\n".join(msg["content"]["traceback"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=timeout)
        return reply["content"], "".join(text)

    def run(self, code: str, timeout: float = 120) -> tuple[dict[str, Any], str]:
        """Run ``code`` and wait for it."""
        return self.finish(self.start(code), timeout)

    def value(self, expression: str) -> Any:
        """The JSON value of an expression evaluated in the kernel."""
        reply, text = self.run(f"import json as _j; print(_j.dumps({expression}))")
        assert reply["status"] == "ok", (reply, text)
        return json.loads(text.strip().splitlines()[-1])

    def click(self, comm_id: str) -> None:
        """Press a button as the browser does: a ``click`` custom message on the widget's comm."""
        content = {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}}
        self.client.shell_channel.send(self.client.session.msg("comm_msg", content))

    def live(self) -> dict[str, dict[str, Any]]:
        """Models that are not closed."""
        return {k: v for k, v in self.models.items() if k not in self.closed}

    def html(self) -> list[str]:
        """Values of the live HTML widgets."""
        return [m.get("value", "") for m in self.live().values() if m.get("_model_name") == "HTMLModel"]

    def buttons(self) -> dict[str, dict[str, Any]]:
        """Live buttons by comm id."""
        return {k: m for k, m in self.live().items() if m.get("_model_name") == "ButtonModel"}

    def button(self, tooltip_part: str) -> str:
        """The comm id of the live button whose tooltip or description contains ``tooltip_part``."""
        found = [k for k, m in self.buttons().items()
                 if tooltip_part in (m.get("tooltip") or "") or tooltip_part == m.get("description")]
        assert len(found) == 1, (tooltip_part, [(m.get("description"), m.get("tooltip")) for m in self.buttons().values()])
        return found[0]

    def wait_for(self, check: Callable[[], T | None], what: str, timeout: float = 120) -> T:
        """Pump iopub until ``check`` holds; fails naming ``what`` (a deadline for a hang, not a speed goal)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            result = check()
            if result:
                return result
        raise AssertionError(f"timed out waiting for {what}; HTML widgets: {self.html()}")


def start_kernel(env: dict[str, str]) -> WidgetKernel:
    """A real python3 kernel with the magic loaded on the local backend."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(REPO), env=env)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    kernel = WidgetKernel(manager, client)
    reply, text = kernel.run("%load_ext gpu_offload.magics\n%gpu_offload config backend=local")
    assert reply["status"] == "ok", (reply, text)
    return kernel


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state directory the module's kernels share (as the kernels of one user server do)."""
    return tmp_path_factory.mktemp("gpu-offload-runs")


@pytest.fixture(scope="module")
def kernels(state_dir: Path) -> Iterator[tuple[WidgetKernel, WidgetKernel]]:
    """Two kernels of one user: the first shows the panel, the second runs cells."""
    env = {**os.environ, "GPU_OFFLOAD_STATE_DIR": str(state_dir)}
    for key in ("GPU_OFFLOAD_NAMESPACE", "GPU_OFFLOAD_SERVICE_URL", "GPU_OFFLOAD_BACKEND"):
        env.pop(key, None)
    started = [start_kernel(env), start_kernel(env)]
    yield started[0], started[1]
    for kernel in started:
        kernel.client.stop_channels()
        kernel.manager.shutdown_kernel(now=False)
