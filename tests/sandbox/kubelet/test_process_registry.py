"""The sandbox's proof that nothing it started outlives it: each sandbox counts its own processes only, and a
session whose leader's pid was later given to an unrelated process is not counted as the sandbox's.

Both happen in one test run: session-scoped sandboxes keep pods running while a module's own sandbox stops,
and pids wrap at 32768 on many machines long before a full run ends."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_offload.sandbox.kubelet import process

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


async def _start(owner: str, cwd: Path) -> process.ContainerProcess:
    return await process.ContainerProcess.start(SLEEP, {"PATH": "/usr/bin:/bin"}, cwd, lambda stream, data: None,
                                                owner=owner)


def test_each_sandbox_counts_only_the_processes_it_started(tmp_path: Path) -> None:
    async def scenario() -> None:
        mine, theirs = await _start("kubelet-mine", tmp_path), await _start("kubelet-theirs", tmp_path)
        try:
            assert process.live_processes("kubelet-mine") == [mine.pid]
            assert process.live_processes("kubelet-theirs") == [theirs.pid]
            assert {mine.pid, theirs.pid} <= set(process.live_processes())
            await mine.stop(grace=5)
            assert process.live_processes("kubelet-mine") == []
            assert process.live_processes("kubelet-theirs") == [theirs.pid]  # still running beside it
        finally:
            await theirs.stop(grace=5)
            await mine.stop(grace=5)
        assert process.live_processes("kubelet-theirs") == []

    asyncio.run(scenario())


def test_a_session_whose_leader_pid_was_reused_by_another_process_is_not_the_sandboxes(tmp_path: Path) -> None:
    async def scenario() -> None:
        ours = await _start("kubelet-reuse", tmp_path)
        pid = ours.pid
        await ours.stop(grace=5)
        # The kernel hands the pid out again once its session is empty; an unrelated program then leads a
        # session with that id. Waiting for a real wrap would take 32768 forks, so the stranger is started
        # first and the registry is told it once had a sandbox process of the same pid but another start.
        stranger = subprocess.Popen(SLEEP, start_new_session=True)
        try:
            started = process._start_time(stranger.pid)
            assert started is not None
            process._SESSIONS[stranger.pid] = process._Session("kubelet-reuse", started - 1)
            assert stranger.pid not in process.live_processes()
            assert process.live_processes("kubelet-reuse") == []
            assert pid not in process.live_processes()
        finally:
            stranger.send_signal(signal.SIGKILL)
            stranger.wait()

    asyncio.run(scenario())


def test_a_child_left_behind_in_a_stopped_containers_session_is_still_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        script = ("import subprocess, sys, time; "  # the child lets go of the output pipes, as a daemon does
                  "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
                  "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); time.sleep(600)")
        proc = await process.ContainerProcess.start([sys.executable, "-c", script], {"PATH": "/usr/bin:/bin"},
                                                    tmp_path, lambda stream, data: None, owner="kubelet-orphan")
        try:
            for _ in range(200):
                if len(process.live_processes("kubelet-orphan")) == 2:
                    break
                await asyncio.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)  # the leader alone: its child stays in the session
            await proc.wait()
            left = process.live_processes("kubelet-orphan")
            assert len(left) == 1 and left[0] != proc.pid
        finally:
            proc.signal_group(signal.SIGKILL)
            for pid in process.live_processes("kubelet-orphan"):
                os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if not process.live_processes("kubelet-orphan"):
                break
            await asyncio.sleep(0.05)
        assert process.live_processes("kubelet-orphan") == []

    asyncio.run(scenario())
