"""A runner whose kernel dies ends itself; a kernel thread that ends does not kill the runner.

A small intermediate Python process stands in for the kernel: it starts the runner with
``--parent-pid`` of itself, and the test kills it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_offload.runner.frames import Done, FrameDecoder
from gpu_offload.runner.secrecy import greeting
from gpu_offload.runner.watchdog import parent_alive

HANG_GUARD = 60.0

KERNEL = """
import os, subprocess, sys, threading, time
pyz, mode, arg, out, stdin_fd, from_thread = sys.argv[1:7]
argv = [sys.executable, "-I", pyz, *(["--bundle", arg] if mode == "oneshot" else ["--session"]),
        "--parent-pid", str(os.getpid())]
def start():
    proc = subprocess.Popen(argv, stdout=open(out, "wb"), stdin=int(stdin_fd),
                            start_new_session=True, pass_fds=())
    print(proc.pid, flush=True)
    while not os.path.getsize(out):  # hello is sent once the watchdog is armed
        time.sleep(0.01)
if from_thread == "yes":
    worker = threading.Thread(target=start)
    worker.start()
    worker.join()  # the thread that forked the runner is gone; the process lives on
else:
    start()
print("thread gone", flush=True)
time.sleep(3600)
"""


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {HANG_GUARD:g} s waiting for {what}")
        time.sleep(0.05)


class Kernel:
    def __init__(self, runner_pyz: Path, tmp_path: Path, mode: str, arg: str, from_thread: bool) -> None:
        self.out = tmp_path / "frames.out"
        self.stdin_r, self.stdin_w = os.pipe()  # the test holds the write end: no EOF ends a session
        if mode == "session":
            os.write(self.stdin_w, greeting(arg))  # the pipe holds it until the runner reads it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                KERNEL,
                str(runner_pyz),
                mode,
                arg,
                str(self.out),
                str(self.stdin_r),
                "yes" if from_thread else "no",
            ],
            stdout=subprocess.PIPE,
            pass_fds=[self.stdin_r],
        )
        assert self.proc.stdout is not None
        self.runner_pid = int(self.proc.stdout.readline())
        assert self.proc.stdout.readline().strip() == b"thread gone"

    def frames(self, nonce: str) -> list:  # type: ignore[type-arg]
        return FrameDecoder(nonce).feed(self.out.read_bytes()) if self.out.exists() else []

    def close(self) -> None:
        for fd in (self.stdin_r, self.stdin_w):
            os.close(fd)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if parent_alive(self.runner_pid):
            os.killpg(self.runner_pid, signal.SIGKILL)


@pytest.fixture
def kernels(runner_pyz: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[Kernel] = []

    def start(mode: str, arg: str, from_thread: bool = False) -> Kernel:
        kernel = Kernel(runner_pyz, tmp_path, mode, arg, from_thread)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.close()


def test_one_shot_runner_ends_when_its_kernel_is_killed(kernels, write_bundle, tmp_path: Path) -> None:
    started = tmp_path / "started"
    cell = "import pathlib, time\npathlib.Path(flag).touch()\nwhile True:\n    time.sleep(0.05)\n"
    path, bundle = write_bundle(cell, inputs={"flag": str(started)})
    kernel = kernels("oneshot", str(path))
    wait_for(started.exists, "the cell to start")
    kernel.proc.kill()
    kernel.proc.wait()
    wait_for(lambda: not parent_alive(kernel.runner_pid), "the orphaned runner to exit")
    done = [e for e in kernel.frames(bundle["nonce"]) if isinstance(e, Done)]
    assert [d.status for d in done] == ["interrupted"]  # the cell was interrupted, not just killed


def test_idle_session_runner_ends_when_its_kernel_is_killed(kernels) -> None:
    nonce = secrets.token_hex(16)
    kernel = kernels("session", nonce)
    wait_for(lambda: bool(kernel.frames(nonce)), "the session's hello")
    kernel.proc.kill()
    kernel.proc.wait()
    # stdin stays open (the test holds it), so only the watchdog can end this runner
    wait_for(lambda: not parent_alive(kernel.runner_pid), "the orphaned session runner to exit")


def test_the_end_of_the_spawning_thread_does_not_end_the_runner(kernels, write_bundle) -> None:
    nonce = secrets.token_hex(16)
    kernel = kernels("session", nonce, from_thread=True)
    path, _ = write_bundle("print('alive')", nonce=nonce)
    os.write(kernel.stdin_w, json.dumps({"op": "run", "bundle": str(path)}).encode() + b"\n")
    wait_for(lambda: any(isinstance(e, Done) for e in kernel.frames(nonce)), "the run to finish")
    (done,) = [e for e in kernel.frames(nonce) if isinstance(e, Done)]
    assert done.status == "ok" and parent_alive(kernel.runner_pid)
