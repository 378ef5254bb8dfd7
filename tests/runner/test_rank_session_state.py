"""A distributed session's node launcher and the checkpoint commands: every rank takes its own part of a command
(its own URL) and writes its own state, naming its rank; on SIGTERM while idle each rank writes the checkpoint the
kernel armed (signed), a rank whose state did not change saying so in its record."""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from gpu_offload.runner.frames import Done, FrameDecoder, UnknownFrame
from gpu_offload.runner.secrecy import greeting
from gpu_offload.runner.session_state import for_rank, manifest_signature

from .conftest import _Store

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

HANG_GUARD = 120.0


class Node:
    """A distributed session's launcher for one node of 2 ranks, its frames decoded for both ranks."""

    def __init__(self, runner_pyz: Path) -> None:
        self.nonce = secrets.token_hex(16)
        self.proc = subprocess.Popen([sys.executable, str(runner_pyz), "--session"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.events: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send_raw(greeting(self.nonce, {"nodes": 1, "procs_per_node": 2, "out_rank": 0}))

    def _read(self) -> None:
        decoder = FrameDecoder(self.nonce, ranks=2)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            for event in decoder.feed(line):
                self.events.put(event)

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def command(self, command: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Send ``command`` to both ranks; each rank's ``checkpoint`` payload once both are done."""
        self.send_raw(json.dumps(command).encode() + b"\n")
        answers: dict[int, dict[str, Any]] = {}
        done: set[int] = set()
        while len(done) < 2:
            event = self.events.get(timeout=HANG_GUARD)
            if isinstance(event, UnknownFrame) and event.kind == "checkpoint":
                answers[event.rank] = event.payload
            elif isinstance(event, Done):
                assert event.status == "ok", event
                done.add(event.rank)
        return answers

    def run(self, cell: str, write_bundle: Any) -> None:
        path, _ = write_bundle(cell, nonce=self.nonce, ranks={"nodes": 1, "procs_per_node": 2, "out_rank": 0})
        self.command({"op": "run", "bundle": str(path), "run_id": "cell"})

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(HANG_GUARD)


@pytest.fixture
def node(runner_pyz: Path) -> Any:
    started = Node(runner_pyz)
    yield started
    started.stop()


def test_a_rank_takes_its_own_part_of_a_command() -> None:
    command = {"op": "checkpoint", "limit": 5, "per_rank": {"0": {"put_url": "a"}, "1": {"put_url": "b"}}}
    assert for_rank(command, 1) == {"op": "checkpoint", "limit": 5, "put_url": "b"}
    assert for_rank({"op": "checkpoint", "put_url": "c"}, None) == {"op": "checkpoint", "put_url": "c"}
    with pytest.raises(KeyError, match="no part for rank 2"):
        for_rank(command, 2)


def test_each_rank_writes_its_own_state_to_its_own_url_and_at_sigterm_while_idle(
        node: Node, write_bundle: Any, store: str) -> None:
    node.run("import os, threading\nmine = int(os.environ['RANK']) * 10 + 1\nguard = threading.Lock()\n", write_bundle)
    base = f"/{secrets.token_hex(6)}"
    parts = {str(r): {"put_url": f"{store}{base}/r{r}?sig=ok"} for r in (0, 1)}
    answers = node.command({"op": "checkpoint", "run_id": "c1", "per_rank": parts})
    for rank in (0, 1):
        manifest = answers[rank]["manifest"]
        assert (manifest["rank"], manifest["saved"], manifest["modules"]) == (rank, ["mine"], {"os": "os", "threading": "threading"})
        assert "guard" in manifest["skipped"]
        state = cloudpickle.loads(_Store.objects[f"{base}/r{rank}"])
        assert state["mine"] == rank * 10 + 1  # each rank's own state, in its own object

    # armed for SIGTERM: rank 0 against a state it no longer has, rank 1 against its very state
    node.run("mine = mine + 1 if int(os.environ['RANK']) == 0 else mine\n", write_bundle)
    unchanged = answers[1]["manifest"]["sha256"]
    term = {str(r): {"put_url": f"{store}{base}/t{r}?sig=ok", "manifest_url": f"{store}{base}/t{r}.m?sig=ok",
                     "unless_sha256": answers[r]["manifest"]["sha256"] if r else "0" * 64} for r in (0, 1)}
    assert unchanged == term["1"]["unless_sha256"]
    node.command({"op": "on_term", "run_id": "c2", "always_record": True, "per_rank": term})
    # the pod's deletion while the session is idle: each rank still writes what was armed (its input stays open)
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(HANG_GUARD) == 143
    written = {r: json.loads(_Store.objects[f"{base}/t{r}.m"]) for r in (0, 1)}
    for rank, manifest in written.items():
        assert manifest["rank"] == rank and manifest["at_term"] is True
        assert manifest["hmac"] == manifest_signature(node.nonce, manifest)  # signed with the session's nonce
    assert cloudpickle.loads(_Store.objects[f"{base}/t0"])["mine"] == 2
    assert written[1]["unchanged"] is True and f"{base}/t1" not in _Store.objects  # said, not written again
