"""The lanes of tests/conftest.py: a fast-lane test that starts a process or a sandbox fails, whatever the
code under test does with the error; the same test in the end-to-end lane passes; ``-m fast`` and ``-m e2e``
split the tests by the fixtures they use; the slowest tests are written to the file CI prints."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # runs pytest as a process

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = '''
import subprocess, sys, threading
import pytest
from gpu_offload.sandbox.testing import running_sandbox

@pytest.fixture(scope="session")
def server():  # a name of E2E_FIXTURES: its users are in the end-to-end lane
    return "server"

@pytest.fixture(scope="session")
def background():  # a helper thread a wider-scoped fixture started before the tests
    ask, done = threading.Event(), threading.Event()
    def serve():
        ask.wait()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        done.set()
    threading.Thread(target=serve, daemon=True).start()
    return ask, done

def test_pure():
    assert sum([1, 2]) == 3

def test_fast_spawn_swallowed():
    try:
        subprocess.run([sys.executable, "-c", "pass"])
    except Exception:
        pass  # the code under test hides the error: the test must fail all the same

def test_fast_spawn_in_a_thread_it_started():
    thread = threading.Thread(target=lambda: subprocess.run([sys.executable, "-c", "pass"]))
    thread.start()
    thread.join()

def test_fast_sandbox(tmp_path):
    with running_sandbox(tmp_path):
        pass

@pytest.mark.e2e
def test_marked_spawn():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_fixture_spawn(server, tmp_path):
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    with running_sandbox(tmp_path):
        pass

def test_background_thread_of_a_wider_fixture(background):
    ask, done = background
    ask.set()
    assert done.wait(60)
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_lanes_inner=TESTS)
    return pytester


def test_a_fast_lane_test_that_starts_a_process_or_a_sandbox_fails_and_the_e2e_lane_may(suite: pytest.Pytester
                                                                                       ) -> None:
    slowest = suite.path / "slowest.txt"
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--slowest-file", str(slowest))
    outcomes = _outcomes(result)
    assert outcomes == {
        "test_pure": "passed",
        "test_fast_spawn_swallowed": "failed",
        "test_fast_spawn_in_a_thread_it_started": "failed",
        "test_fast_sandbox": "failed",
        "test_marked_spawn": "passed",
        "test_fixture_spawn": "passed",
        "test_background_thread_of_a_wider_fixture": "passed",
    }, result.stdout.str()
    out = result.stdout.str()
    assert "test_fast_spawn_swallowed is in the fast lane but started a process" in out
    assert "test_fast_sandbox is in the fast lane but started a sandbox API server" in out
    # test_fast_sandbox's was refused at start; no origin among them
    assert "sandbox API servers started in this session: 2, of them origins: 0" in out
    lines = slowest.read_text().splitlines()
    assert len(lines) == 7 and all("test_lanes_inner.py::" in line for line in lines)
    seconds = [float(line.split("s", 1)[0]) for line in lines]
    assert seconds == sorted(seconds, reverse=True)


def test_the_markers_split_the_lanes_by_the_fixtures_a_test_uses(suite: pytest.Pytester) -> None:
    fast = suite.runpytest_subprocess("-p", "no:cacheprovider", "-m", "fast", "--collect-only", "-q")
    e2e = suite.runpytest_subprocess("-p", "no:cacheprovider", "-m", "e2e", "--collect-only", "-q")

    def names(result: pytest.RunResult) -> set[str]:
        return {line.split("::")[-1] for line in result.stdout.lines if "::" in line}

    assert names(fast) == {"test_pure", "test_fast_spawn_swallowed", "test_fast_spawn_in_a_thread_it_started",
                           "test_fast_sandbox", "test_background_thread_of_a_wider_fixture"}
    assert names(e2e) == {"test_marked_spawn", "test_fixture_spawn"}


def _outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each test's outcome (passed, failed, error) from the run's ``-rA`` summary."""
    found = (re.match(r"(PASSED|FAILED|ERROR) \S+::(\w+)", line) for line in result.stdout.lines)
    return {match[2]: match[1].lower() for match in found if match}


ORIGIN_MODULE = '''
from gpu_offload.sandbox.fixtures import origin_fixture

origin = origin_fixture({args})

def test_{name}_one(origin):
    assert origin.peered() == {peered}

def test_{name}_two(origin):
    assert origin.peered() == {peered}
'''


def test_one_origin_configuration_starts_once_on_two_workers_and_the_limit_fails_the_run(pytester: pytest.Pytester
                                                                                        ) -> None:
    """Two modules share the default configuration with other donors each (each module's are peered for it and
    unpeered after it), a third has options of its own: on two xdist workers with the lanes' ``--dist loadgroup``,
    the shared one starts once (without the groups each worker would start it; without peering per module each donor
    set would), and a run that reaches ``--max-origins`` fails although every test passed."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_first=ORIGIN_MODULE.format(args="", name="first", peered=["donor-1", "donor-2"]),
                        test_second=ORIGIN_MODULE.format(args="donors=1", name="second", peered=["donor-1"]),
                        test_third=ORIGIN_MODULE.format(args="donors=1, backoff=1.0", name="third",
                                                        peered=["donor-1"]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                                           "--max-origins", "2", "-rA")
    out = result.stdout.str()
    assert "6 passed" in out, out
    assert "of them origins: 2" in out, out
    # each start is listed with its configuration and the test that started it
    listed = sorted(line.split("origin: ", 1)[1] for line in result.stdout.lines if "  origin: " in line)
    assert len(listed) == 2, listed
    assert re.fullmatch(r"no donors; crds: built-in  <- test_(first|second)\.py::test_\w+", listed[0]), listed
    assert re.fullmatch(r"no donors; crds: built-in; backoff#\w{6}  <- test_third\.py::test_third_\w+", listed[1]), listed
    assert "FAILED: 2 sandbox origins started, the limit is fewer than 2" in out, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED


CTRL_C = '''
import signal, subprocess, sys
import pytest

@pytest.mark.e2e
def test_ctrl_c_reaches_a_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\\n"
    child.send_signal(signal.SIGINT)
    assert child.wait(60) == -signal.SIGINT  # KeyboardInterrupt, as after a terminal's Ctrl-C
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_suite_started_with_sigint_ignored_still_lets_ctrl_c_reach_the_processes_it_starts(
        pytester: pytest.Pytester, workers: list[str]) -> None:
    """``.ci/run > log &`` from a script starts the suite with SIGINT ignored, which every child would inherit."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_ctrl_c=CTRL_C)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *workers], cwd=pytester.path,
                          capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
