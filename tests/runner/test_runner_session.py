"""The warm session runner: commands on stdin, state across runs, interrupts that leave it alive."""

from __future__ import annotations

import base64
import json
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from gpu_offload.runner.bundle import encode_bundle
from gpu_offload.runner.frames import DisplayData, Done, Error, Hello, Metrics, Stopping, Stream
from gpu_offload.runner.secrecy import greeting

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


@pytest.fixture
def session(start_runner, write_bundle):  # type: ignore[no-untyped-def]
    """A started session runner plus ``run(cell, **bundle_kwargs)`` that waits for the run's ``done``."""
    nonce = secrets.token_hex(16)
    runner = start_runner(None, nonce, stdin=subprocess.PIPE)
    runner.send(greeting(nonce).decode().rstrip("\n"))

    def start(cell: str, **kwargs) -> None:  # type: ignore[no-untyped-def]
        path, _ = write_bundle(cell, nonce=nonce, **kwargs)
        runner.send(json.dumps({"op": "run", "bundle": str(path)}))

    def run(cell: str, **kwargs):  # type: ignore[no-untyped-def]
        start(cell, **kwargs)
        return runner.until_done()

    runner.start = start
    runner.run = run
    return runner


def text(events: list) -> str:  # type: ignore[type-arg]
    return "".join(e.text for e in events if isinstance(e, Stream) and e.name == "stdout")


def test_state_persists_across_runs_and_bundles_can_come_inline(session, write_bundle) -> None:
    first = session.run("x = 41\nimport math\n")
    assert first[-1].status == "ok"
    _, bundle = write_bundle("x += 1\nprint(x, math.pi > 3)\n", nonce=session.decoder.nonce)
    session.send(json.dumps({"op": "run", "bundle_b64": base64.b64encode(encode_bundle(bundle)).decode()}))
    second = session.until_done()
    assert text(second) == "42 True\n" and second[-1].status == "ok"
    hello = session.of(Hello)
    assert len(hello) == 1 and hello[0].session is True
    assert len(session.of(Metrics)) == 1  # "no GPU" is said once per runner, not per run
    session.send(json.dumps({"op": "exit"}))
    _, code = session.finish()
    assert code == 0


def test_interrupt_command_stops_the_cell_and_keeps_the_session(session) -> None:
    session.run("x = 7\n")
    session.start("import time\ny = 1\nprint('ready')\nwhile True:\n    time.sleep(0.05)\n")
    session.until(lambda e: isinstance(e, Stream) and "ready" in e.text)
    session.send(json.dumps({"op": "interrupt"}))
    interrupted = session.until_done()
    assert [e.ename for e in interrupted if isinstance(e, Error)] == ["KeyboardInterrupt"]
    assert interrupted[-1].status == "interrupted"
    assert session.proc.poll() is None
    after = session.run("print(x, y)\n")
    assert text(after) == "7 1\n" and after[-1].status == "ok"


def test_an_interrupt_between_cells_is_harmless(session) -> None:
    session.send(json.dumps({"op": "interrupt"}))
    after = session.run("print('still here')\n")
    assert text(after) == "still here\n" and after[-1].status == "ok"


@pytest.mark.parametrize(
    "command, expected",
    [
        ("not json", "not JSON"),
        (json.dumps({"op": "run"}), '"bundle"'),
        (json.dumps({"op": "run", "bundle": "/nonexistent/b.pkl"}), "/nonexistent/b.pkl"),
        (json.dumps({"op": "run", "bundle_b64": "%%%"}), "base64"),
        (json.dumps({"op": "dance"}), "run, interrupt, checkpoint, restore, on_term or exit"),
    ],
)
def test_bad_commands_are_reported_and_the_session_goes_on(session, command: str, expected: str) -> None:
    session.send(command)
    events = session.until_done()
    (error,) = [e for e in events if isinstance(e, Error)]
    assert error.ename == "ProtocolError" and expected in error.evalue
    assert isinstance(events[-1], Done) and events[-1].status == "error"
    assert session.run("print('ok')")[-1].status == "ok"


def test_a_run_for_another_python_ends_the_session_with_the_mismatch(session, write_bundle) -> None:
    path, _ = write_bundle("x = 1", nonce=session.decoder.nonce, python="3.10")
    session.send(json.dumps({"op": "run", "bundle": str(path)}))
    events, code = session.finish()
    assert code == 3
    assert [e.ename for e in events if isinstance(e, Error)] == ["PythonVersionMismatch"]


def test_end_of_stdin_ends_the_session(session) -> None:
    session.run("x = 1")
    assert session.proc.stdin is not None
    session.proc.stdin.close()
    _, code = session.finish()
    assert code == 0


@pytest.mark.parametrize("first", ['{"op": "run", "bundle": "b.pkl"}', '{"op": "start", "nonce": "abc"}', ""])
def test_a_session_without_its_nonce_first_is_refused(start_runner, first: str) -> None:
    runner = start_runner(None, "0" * 32, stdin=subprocess.PIPE)
    runner.send(first)
    events, code = runner.finish()
    assert code == 2 and events == []
    assert "frame nonce" in runner.stderr()


def test_outputs_of_a_session_cannot_be_changed_by_later_cells(session, write_bundle, tmp_path) -> None:
    import numpy as np

    from gpu_offload.runner import buffers
    from gpu_offload.runner.frames import Outputs

    path, bundle = write_bundle(
        "b = a\n",
        inputs={"a": np.ones(200_000)},
        outputs=["b"],
        shm_dir=str(tmp_path),
        nonce=session.decoder.nonce,
    )
    inode = Path(bundle["buffers"][0]["path"]).stat().st_ino
    session.send(json.dumps({"op": "run", "bundle": str(path)}))
    (outputs,) = [e for e in session.until_done() if isinstance(e, Outputs)]
    (back,) = outputs.buffers
    assert Path(back["path"]).stat().st_ino == inode  # the input's pages came back under a new name
    values = buffers.load_packed(outputs.pickle, outputs.buffers)
    assert session.run("a *= 0\nb *= 0\n")[-1].status == "ok"  # the warm runner changes its arrays in place
    assert values["b"].sum() == 200_000  # the notebook's copy is its own
    assert not list(tmp_path.glob("gpuo-*"))


def test_an_interrupt_sent_right_after_its_run_is_not_lost(session, write_bundle) -> None:
    path, _ = write_bundle("import time\nwhile True:\n    time.sleep(0.05)\n", nonce=session.decoder.nonce)
    # one write: the interrupt may reach the runner before, while or after it starts the run
    run = json.dumps({"op": "run", "bundle": str(path)})
    session.send(run + "\n" + json.dumps({"op": "interrupt"}))
    events = session.until_done()
    assert events[-1].status == "interrupted"
    assert session.run("print('next run is not interrupted')")[-1].status == "ok"


def test_an_interrupt_for_a_rejected_run_does_not_hit_the_next_one(session) -> None:
    session.send(
        json.dumps({"op": "run", "bundle": "/nonexistent/b.pkl"}) + "\n" + json.dumps({"op": "interrupt"})
    )
    assert session.until_done()[-1].status == "error"
    assert session.run("print('fine')")[-1].status == "ok"


def test_each_runs_frames_carry_its_run_id(session) -> None:
    from gpu_offload.runner.frames import FrameDecoder

    session.run("print('first')\n", run_id="r-1")
    session.run("print('second')\n", run_id="r-2")
    # a reader that moved on to the second run never takes the first run's frames for its own
    decoder = FrameDecoder(session.decoder.nonce, run_id="r-2")
    events = decoder.feed(b"".join(session.raw_lines))
    assert text(events) == "second\n"
    assert [type(e) for e in events if isinstance(e, (Hello, Done))] == [Hello, Done]
    assert decoder.foreign >= 2  # the first run's stream and done at least


def test_a_cell_run_again_gets_the_name_the_notebook_gives_it_and_an_edited_one_runs_anew(session) -> None:
    # a session keeps compiled cells per text; the notebook names each run anew (In[N] moves on)
    failing = "def f():\n    return 1 / 0\nf()\n"
    for number in (3, 4):
        events = session.run(failing, filename=f"<offloaded cell {number}>")
        [error] = [e for e in events if isinstance(e, Error)]
        shown = "".join(error.traceback)
        assert error.ename == "ZeroDivisionError"
        assert shown.count(f'"<offloaded cell {number}>"') == 2, shown  # the cell's frame and f's
        assert "return 1 / 0" in shown and "line 3" in shown  # the line as the notebook numbers it
    first = session.run("x = 1\nx * 10\n")
    edited = session.run("x = 2\nx * 10\n")
    again = session.run("x = 1\nx * 10\n", filename="<offloaded cell 9>")
    assert [[e.data["text/plain"] for e in run if isinstance(e, DisplayData)] for run in (first, edited, again)] == [
        ["10"], ["20"], ["10"]]


def test_sigterm_during_a_cell_says_so_in_the_cell_before_it_is_interrupted(session) -> None:
    # a pod's deletion (a preemption, a drain, an eviction): the notice frame comes first, then the interruption
    session.run("x = 7\n")
    session.start("import time\nprint('ready')\nwhile True:\n    time.sleep(0.05)\n")
    session.until(lambda e: isinstance(e, Stream) and "ready" in e.text)
    session.proc.send_signal(signal.SIGTERM)
    events = session.until_done()
    [stopping] = [e for e in events if isinstance(e, Stopping)]
    assert (stopping.signal, stopping.session, stopping.checkpoint) == ("SIGTERM", True, False)  # none armed
    kinds = [type(e) for e in events if isinstance(e, (Stopping, Error, Done))]
    assert kinds == [Stopping, Error, Done] and events[-1].status == "interrupted"
    _, code = session.finish()
    assert code == 143 and not session.of(Stopping)[1:]  # once, and the runner ends on the signal


def test_sigterm_between_cells_sends_no_notice(session) -> None:
    session.run("x = 7\n")
    session.proc.send_signal(signal.SIGTERM)
    _, code = session.finish()
    assert code == 143 and session.of(Stopping) == []  # no cell runs: nothing to show it in
