"""A subprocess of the cell, under the runner's own unprivileged uid (as in a pod with runAsUser), cannot
learn the frame nonce or reach the frame channel, so it cannot inject a frame.

The tests run as root: the runner is started under uid 1000 (what the sandbox's kubelet does for a pod
with ``runAsUser: 1000``), from a copy of the zipapp that uid can read.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import Done, RunnerWarning, Stream
from gpu_offload.runner.secrecy import greeting

from .conftest import RunnerProcess

UID = 1000

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="needs Linux and root, to run the runner under another uid",
)

# Every way into the runner a same-uid process has, tried in turn; with a nonce found, forged frames (a
# warning, then a `done` that would end the run early) go to every descriptor of the runner's that opens.
PROBE = r"""
import json, os, re
runner = os.getppid()
report = {}
def attempt(name, read):
    try:
        report[name] = read()
    except OSError as exc:
        report[name] = "denied: " + type(exc).__name__
attempt("environ", lambda: open(f"/proc/{runner}/environ", "rb").read().decode("latin-1"))
args = open(f"/proc/{runner}/cmdline", "rb").read().split(b"\0")
path = args[args.index(b"--bundle") + 1].decode() if b"--bundle" in args else "-"
attempt("bundle", lambda: "-" if path == "-" else open(path, "rb").read().hex())
def mem():
    with open(f"/proc/{runner}/mem", "rb"):
        return "opened"
attempt("mem", mem)
writable = []
def fds():
    found = {}
    for n in os.listdir(f"/proc/{runner}/fd"):
        try:
            writable.append(os.open(f"/proc/{runner}/fd/{n}", os.O_WRONLY | os.O_NONBLOCK))
            found[n] = "opened"
        except OSError as exc:
            found[n] = type(exc).__name__
    return found
attempt("fds", fds)
seen = " ".join(str(v) for v in report.values())
nonces = set(re.findall(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", seen))
for nonce in nonces:
    for fd in writable:
        try:
            os.write(fd, f'\x1egpuo {nonce} 999998 - 0 warning {{"text":"INJECTED"}}\n'
                         f'\x1egpuo {nonce} 999999 - 0 done {{"status":"ok","elapsed":0}}\n'.encode())
        except OSError:
            pass
print("REPORT" + json.dumps(report), flush=True)
"""
CELL = f"import subprocess\nsubprocess.run(['/proc/self/exe', '-I', '-c', {PROBE!r}], check=True)\n"


@pytest.fixture
def shared_runner(runner_pyz: Path) -> Iterator[Path]:
    """A copy of the zipapp that uid 1000 can read. pytest's own tmp dirs are root's alone (mode 0700), and
    how deep they nest depends on the run (xdist workers add a level), so the copy gets a folder of its own
    in the system's temporary directory."""
    place = Path(tempfile.mkdtemp(prefix="gpuo-shared-"))
    place.chmod(0o755)
    copy = place / "runner.pyz"
    shutil.copyfile(runner_pyz, copy)
    copy.chmod(0o644)
    yield copy
    shutil.rmtree(place)


AS_UID = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]


@pytest.fixture(scope="module")
def python() -> str:
    """An interpreter of this minor version that uid 1000 may run (this venv's may live under /root)."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/python{minor}"):
        check = [*AS_UID, candidate, "-I", "-c", "import sys; print(sys.version_info[:2])"]
        done = subprocess.run(check, capture_output=True, text=True, cwd="/")
        if done.returncode == 0 and done.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    pytest.skip(f"no Python {minor} that uid {UID} may run")


def start(python: str, runner: Path, mode: list[str], nonce: str) -> RunnerProcess:
    argv = [*AS_UID, python, "-I", str(runner)]
    env = {"PATH": os.environ["PATH"], "HOME": "/tmp"}
    # the engine's side of the pipes is the runner's uid too, as with the local backend
    return RunnerProcess([*argv, *mode], nonce, env=env, owner=UID)


def probe_report(events: list) -> dict:  # type: ignore[type-arg]
    text = "".join(e.text for e in events if isinstance(e, Stream))
    assert "REPORT" in text, text
    return json.loads(text.split("REPORT", 1)[1].splitlines()[0])


def assert_nothing_reached(events: list, nonce: str) -> dict:  # type: ignore[type-arg]
    """Check that no forged frame arrived and no way in was open; returns the probe's report."""
    assert not [e for e in events if isinstance(e, RunnerWarning) and "INJECTED" in e.text], events
    report = probe_report(events)
    assert nonce not in json.dumps(report)
    assert report["mem"].startswith("denied")
    assert report["fds"].startswith("denied") or "opened" not in report["fds"].values(), report["fds"]
    done = events[-1]
    assert isinstance(done, Done) and done.status == "ok"
    return report


def test_a_session_runners_nonce_is_out_of_reach_of_the_cells_subprocesses(
    python: str, shared_runner: Path
) -> None:
    nonce = secrets.token_hex(16)
    runner = start(python, shared_runner, ["--session"], nonce)
    try:
        assert runner.proc.stdin is not None
        runner.proc.stdin.write(greeting(nonce))
        runner.proc.stdin.flush()
        bundle = encode_bundle(make_bundle(CELL, nonce=secrets.token_hex(16), run_id="probe"))
        import base64

        runner.send(json.dumps({"op": "run", "bundle_b64": base64.b64encode(bundle).decode()}))
        events = runner.until_done()
    finally:
        runner.kill()
    assert_nothing_reached(events, nonce)


def test_a_one_shot_runners_nonce_is_out_of_reach_of_the_cells_subprocesses(
    python: str, shared_runner: Path
) -> None:
    nonce = secrets.token_hex(16)
    runner = start(python, shared_runner, ["--bundle", "-"], nonce)
    try:
        assert runner.proc.stdin is not None
        runner.proc.stdin.write(encode_bundle(make_bundle(CELL, nonce=nonce, run_id="probe")))
        runner.proc.stdin.close()
        events = runner.until_done()
    finally:
        runner.kill()
    assert assert_nothing_reached(events, nonce)["bundle"] == "-"
