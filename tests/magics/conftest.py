"""Fixtures for the magic: a real IPython shell, a real kernel, and a check that no runner is left behind."""

from __future__ import annotations

import os
import queue
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpu_offload.engine.backends.base import Job, Run, SessionInfo
from gpu_offload.engine.backends.local import LocalBackend

REPO = Path(__file__).resolve().parents[2]
RUN_MARK = "GPU_OFFLOAD_TEST_RUN"
# Kernels and runners started by these tests inherit the mark, so the leak check below sees only our own
# runners even while other test sessions on the machine start theirs.
os.environ[RUN_MARK] = secrets.token_hex(8)


def _is_runner_zipapp(argument: str) -> bool:
    name = Path(argument).name
    return name.startswith("runner") and name.endswith(".pyz")  # build_runner() names it runner-<hash>.pyz


def our_runners() -> list[psutil.Process]:
    """Runner processes (``runner*.pyz`` on the command line) started by this test session."""
    found = []
    for proc in psutil.process_iter():
        try:
            if not any(_is_runner_zipapp(part) for part in proc.cmdline()):
                continue
            if proc.environ().get(RUN_MARK) == os.environ[RUN_MARK]:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True)
def no_runner_left_behind() -> Iterator[None]:
    """After each test, every runner it started has exited (a little time is allowed for exiting)."""
    yield
    _, alive = psutil.wait_procs(our_runners(), timeout=10)
    for proc in alive:
        proc.kill()
    assert not alive, f"runner processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"


@dataclass
class CountingBackend:
    """The real local backend, counting what was submitted (to prove that bad input launches nothing)."""

    inner: LocalBackend = field(default_factory=LocalBackend)
    submitted: list[Job] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def transfer(self) -> Any:
        return self.inner.transfer

    def describe(self) -> str:
        return self.inner.describe()

    def inventory(self) -> Any:
        return self.inner.inventory()

    def user_runs(self) -> Any:
        return self.inner.user_runs()

    def trusts(self, cluster: str) -> bool:
        return self.inner.trusts(cluster)

    def submit(self, job: Job) -> Run:
        self.submitted.append(job)
        return self.inner.submit(job)

    def sessions(self) -> list[SessionInfo]:
        return self.inner.sessions()

    def close_session(self, name: str, grace: float = 5.0) -> bool:
        return self.inner.close_session(name, grace)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def backend() -> Iterator[CountingBackend]:
    counting = CountingBackend()
    yield counting
    counting.close()


@pytest.fixture
def shell(backend: CountingBackend) -> Iterator[Any]:
    """A real IPython shell with the magic registered over ``backend``; its namespace is reset per test."""
    from gpu_offload.magics.magic import GpuOffloadMagics
    from IPython.core.interactiveshell import InteractiveShell

    ipython = InteractiveShell.instance()
    ipython.reset()
    magics = GpuOffloadMagics(ipython, backends={"local": backend})
    magics.backend = "local"
    ipython.register_magics(magics)
    ipython.gpu_offload_magics = magics
    yield ipython
    magics.close()


@dataclass
class Kernel:
    """A real Jupyter kernel and a client for it."""

    manager: Any
    client: Any

    def execute(
        self, code: str, on_output: Callable[[dict[str, Any]], None] | None = None, timeout: float = 120
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Run ``code``; returns the execute reply's content and the iopub messages of the cell."""
        msg_id = self.client.execute(code)
        outputs = self.collect(msg_id, on_output, timeout)
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=timeout)
        return reply["content"], outputs

    @staticmethod
    def text(outputs: list[dict[str, Any]], name: str = "stdout") -> str:
        """All text a cell wrote to one stream."""
        return "".join(
            m["content"]["text"]
            for m in outputs
            if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    def collect(
        self, msg_id: str, on_output: Callable[[dict[str, Any]], None] | None, timeout: float
    ) -> list[dict[str, Any]]:
        """The iopub messages of one execution, until the kernel is idle again."""
        outputs = []
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=timeout)
            except queue.Empty as exc:
                raise AssertionError(f"no message from the kernel within {timeout} s") from exc
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return outputs
            if msg["msg_type"] in ("stream", "display_data", "update_display_data", "error", "execute_result"):
                outputs.append(msg)
                if on_output is not None:
                    on_output(msg)


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    """One kernel per test module, with the extension loaded."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(REPO))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    started = Kernel(manager, client)
    reply, _ = started.execute("%load_ext gpu_offload.magics\n%gpu_offload config backend=local")
    assert reply["status"] == "ok", reply
    yield started
    client.stop_channels()
    manager.shutdown_kernel(now=False)
