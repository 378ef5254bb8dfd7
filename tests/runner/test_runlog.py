"""A run's log kept for ``gpu-offload logs``: what the runner uploads to the bundle's ``log_url`` before its
``done`` frame, and what happens when the upload fails."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from gpu_offload.runner.frames import Done, Error, RunnerWarning
from gpu_offload.runner.runlog import RunLog

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

CELL = ("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
        "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\nraise ValueError('bad')\n")


def test_the_runner_uploads_what_it_showed_before_its_done_frame(write_bundle: Any, start_runner: Any,
                                                                 store: str) -> None:
    path, bundle = write_bundle(CELL, log_url=f"{store}/u/run-1/log?sig=ok")
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 1 and runner.of(Done)[0].status == "error"
    log = urllib.request.urlopen(f"{store}/u/run-1/log").read().decode()
    assert "to stderr\n" in log  # its place beside stdout's lines depends on which pipe is read first
    assert log.replace("to stderr\n", "").startswith("to stdout\n<IPython.core.display.HTML object>\n"), log
    (error,) = runner.of(Error)
    assert log.endswith("".join(error.traceback)) and "ValueError: bad" in log


def test_a_refused_upload_is_a_warning_and_the_run_keeps_its_result(write_bundle: Any, start_runner: Any,
                                                                    store: str) -> None:
    path, bundle = write_bundle("y = 1", log_url=f"{store}/u/run-2/log?sig=expired")
    runner = start_runner(path, bundle["nonce"])
    _, code = runner.finish()
    assert code == 0
    (warning,) = runner.of(RunnerWarning)
    assert warning.text.startswith("the run's log was not kept in object storage: upload of a")
    assert "403" in warning.text


def test_a_long_log_keeps_its_end_and_says_how_much_was_cut() -> None:
    log = RunLog(limit=10)
    log.begin("http://unused")
    for part in ("aaaa", "bbbb", "cccc", "dd"):
        log.add(part)
    assert log.content() == b"[gpu-offload: the first 4 bytes of this log were not kept]\nbbbbccccdd"


def test_without_a_url_nothing_is_kept() -> None:
    log = RunLog()
    log.begin("")
    log.add("text")
    assert log.content() == b"" and log.upload() == ""
