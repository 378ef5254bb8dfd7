"""Fixtures for the runner tests: the real zipapp, bundles on disk, and a runner process read frame by frame."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpu_offload.runner.build import build_runner
from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import Done, Event, FrameDecoder, Noise, Stream

# the magic's check that no runner is left behind applies here as it did under tests/magics/
from ..magics.conftest import no_runner_left_behind  # noqa: F401 (an autouse fixture, by name)

HANG_GUARD = 120.0
"""Seconds after which a test gives up waiting for a frame: a guard against hangs, not a speed claim."""


@pytest.fixture(scope="session")
def runner_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_runner(tmp_path_factory.mktemp("runner-cache"))


class RunnerProcess:
    """A runner subprocess whose stdout is decoded into events by a reader thread, as the engine does."""

    def __init__(
        self,
        argv: Sequence[str],
        nonce: str,
        env: dict[str, str] | None = None,
        stdin: Any = None,
        owner: int | None = None,
    ) -> None:
        """``owner``: the uid that owns the stdin and stdout pipes (as when the engine runs under the runner's
        uid, like the local backend), so that uid may reopen them through ``/proc`` unless the runner stops it."""
        if owner is None:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        else:
            self.proc = _popen_with_owned_pipes(list(argv), env, owner)
        self.decoder = FrameDecoder(nonce)
        self.raw_lines: list[bytes] = []
        self.noise: list[Noise] = []
        self.seen: list[Event] = []
        self._events: queue.Queue[Event | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw_lines.append(line)
            for event in self.decoder.feed(line):
                if isinstance(event, Noise):
                    self.noise.append(event)
                else:
                    self._events.put(event)
        for event in self.decoder.close():
            self._events.put(event)
        self._events.put(None)

    def next_event(self) -> Event | None:
        """The next frame event, ``None`` at end of output."""
        try:
            event = self._events.get(timeout=HANG_GUARD)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"no frame from the runner within {HANG_GUARD:g} s") from None
        if event is not None:
            self.seen.append(event)
        return event

    def of(self, kind: type) -> list[Any]:
        """The events of one class received so far, in order."""
        return [event for event in self.seen if isinstance(event, kind)]

    def stdout(self) -> str:
        """All ``stdout`` stream text received so far."""
        return "".join(e.text for e in self.of(Stream) if e.name == "stdout")

    def until(self, predicate: Callable[[Event], bool]) -> list[Event]:
        """Events up to and including the first that matches ``predicate``."""
        seen = []
        while True:
            event = self.next_event()
            if event is None:
                raise AssertionError(f"runner output ended before the awaited event; got {seen!r}")
            seen.append(event)
            if predicate(event):
                return seen

    def until_done(self) -> list[Event]:
        """Events up to and including the next ``done`` frame."""
        return self.until(lambda event: isinstance(event, Done))

    def finish(self) -> tuple[list[Event], int]:
        """All remaining events and the exit code."""
        events = []
        while (event := self.next_event()) is not None:
            events.append(event)
        return events, self.proc.wait(timeout=HANG_GUARD)

    def send(self, line: str) -> None:
        """Write one command line to the runner's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def _popen_with_owned_pipes(argv: list[str], env: dict[str, str] | None, owner: int) -> subprocess.Popen[bytes]:
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    for fd in (stdin_r, stdin_w, stdout_r, stdout_w):
        os.fchown(fd, owner, owner)
    try:
        proc = subprocess.Popen(argv, stdin=stdin_r, stdout=stdout_w, stderr=subprocess.PIPE, env=env,
                                start_new_session=True)
    finally:
        os.close(stdin_r)
        os.close(stdout_w)
    proc.stdin = os.fdopen(stdin_w, "wb")
    proc.stdout = os.fdopen(stdout_r, "rb")
    return proc


@pytest.fixture
def write_bundle(tmp_path: Path) -> Callable[..., tuple[Path, dict[str, Any]]]:
    """``write_bundle(cell, **make_bundle_kwargs)`` -> (path, bundle); inputs travel through tmp shm files."""
    counter = iter(range(1_000_000))

    def write(cell: str, **kwargs: Any) -> tuple[Path, dict[str, Any]]:
        kwargs.setdefault("filename", "<offloaded cell 1>")
        kwargs.setdefault("first_line", 2)
        bundle = make_bundle(cell, **kwargs)
        path = tmp_path / f"bundle-{next(counter)}.pkl"
        path.write_bytes(encode_bundle(bundle))
        return path, bundle

    return write


@pytest.fixture
def start_runner(runner_pyz: Path) -> Iterator[Callable[..., RunnerProcess]]:
    """``start_runner(bundle_path, nonce, python=..., extra=[...])`` starts the zipapp one-shot."""
    started: list[RunnerProcess] = []

    def start(
        bundle_path: Path | None,
        nonce: str,
        *,
        python: Sequence[str] = (sys.executable, "-I"),
        extra: Sequence[str] = (),
        env: dict[str, str] | None = None,
        stdin: Any = None,
    ) -> RunnerProcess:
        mode = ["--bundle", str(bundle_path)] if bundle_path is not None else ["--session"]
        runner = RunnerProcess([*python, str(runner_pyz), *mode, *extra], nonce, env=env, stdin=stdin)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.kill()


class _Store(BaseHTTPRequestHandler):
    """A tiny object store: PUT needs `sig=ok` in the query (a stand-in for a presigned URL), GET returns."""

    objects: dict[str, bytes] = {}

    def do_PUT(self) -> None:  # noqa: N802 (http.server's naming)
        if "sig=ok" not in self.path:
            self.send_response(403)
            self.end_headers()
            return
        self.objects[self.path.split("?")[0]] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        body = self.objects[self.path.split("?")[0]]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def store() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
