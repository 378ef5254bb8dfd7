"""``gpu-offload run`` on the local backend, as a shell user runs it: a child process whose exit code is the
script's, 130 after Ctrl-C (runner stopped), a detached ``--noblock`` run with ``logs -f`` and ``cancel``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from .helpers import argv, cli, environment, write_project

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "proj")


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    return environment(tmp_path / "state")


def test_a_script_runs_as_python_would_run_it_with_its_workdir(project: Path, env: dict[str, str]) -> None:
    done = cli(["run", "--backend", "local", "--gpus", "0", "--gpu-model", "A100", str(project), "a", "--gpus", "2"],
               project.parent.parent, env)
    assert done.returncode == 0, done.stderr
    # everything after the script is the script's, --gpus too
    assert done.stdout.splitlines() == ["hello from helper small data __main__ ['a', '--gpus', '2']",
                                        "big.bin left home"]
    assert "the local backend ignores --gpu-model" in done.stderr


def test_the_exit_code_is_the_scripts(project: Path, env: dict[str, str]) -> None:
    done = cli(["run", "--backend", "local", "--gpus", "0", "main.py", "exit", "7"], project.parent, env)
    assert done.returncode == 7, done.stderr
    failed = cli(["run", "--backend", "local", "--gpus", "0", "main.py", "raise"], project.parent, env)
    assert failed.returncode == 1
    assert "ValueError: boom from the script" in failed.stderr and 'File "main.py", line 8' in failed.stderr
    assert "gpu_offload" not in failed.stderr  # the script's frames only


def test_usage_errors_are_one_sentence(project: Path, env: dict[str, str]) -> None:
    done = cli(["run", "--backend", "local", "missing.py"], project.parent, env)
    assert done.returncode == 2 and done.stderr.startswith("gpu-offload run: missing.py: no such file")
    (project.parent / ".gitignore").write_text("")
    capped = cli(["run", "--backend", "local", "main.py"], project.parent, env)
    assert capped.returncode == 2 and "over the 10 MB cap" in capped.stderr and "Traceback" not in capped.stderr


def test_ctrl_c_stops_the_runner_and_exits_130(project: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(argv("run", "--backend", "local", "--gpus", "0", "main.py", "sleep"), cwd=project.parent,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    while "tick 1" not in (line := proc.stdout.readline()):
        assert line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(out.splitlines()) < 50  # stopped, not run to its 600th tick (the autouse check: no runner left)


def runs(cwd: Path, env: dict[str, str]) -> list[dict[str, object]]:
    listed = cli(["runs", "--json"], cwd, env)
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


def test_noblock_then_logs_follow_then_cancel(project: Path, env: dict[str, str]) -> None:
    started = cli(["run", "--backend", "local", "--gpus", "0", "--noblock", "main.py", "sleep"], project.parent, env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    (row,) = runs(project.parent, env)
    assert row["run_id"] == run_id and row["kind"] == "script" and row["state"] in ("scheduling", "running")
    follower = subprocess.Popen(argv("logs", run_id, "-f"), cwd=project.parent, env=env, stdout=subprocess.PIPE,
                                text=True)
    assert follower.stdout is not None
    seen: list[str] = []
    wait_until(lambda: seen.append(follower.stdout.readline()) or "tick 2" in seen[-1],  # type: ignore[union-attr, func-returns-value]
               "the log to follow the run")
    assert "hello from helper small data __main__ ['sleep']\n" in seen
    cancelled = cli(["cancel", run_id[:8]], project.parent, env)
    assert cancelled.returncode == 0 and f"run {run_id} ended: failed (cancelled)" in cancelled.stdout
    rest, _ = follower.communicate(timeout=60)  # -f returns once the run has ended
    assert follower.returncode == 0 and "interrupted" in rest
    (row,) = runs(project.parent, env)
    assert row["state"] == "failed" and row["detail"] == "cancelled"


def test_a_failed_background_start_says_why_at_once(project: Path, env: dict[str, str]) -> None:
    done = cli(["run", "--backend", "local", "--noblock", "nothere.py"], project.parent, env)
    assert done.returncode == 2 and "nothere.py: no such file" in done.stderr
    assert not list((Path(env["GPU_OFFLOAD_STATE_DIR"])).glob("*.log"))  # its log is not left behind


def test_timeout_stops_the_run_and_exits_124(project: Path, env: dict[str, str]) -> None:
    done = cli(["run", "--backend", "local", "--gpus", "0", "--timeout", "3", "main.py", "sleep"], project.parent, env)
    assert done.returncode == 124
    assert "ran longer than --timeout 3 s" in done.stderr


def test_sigterm_to_a_background_follower_stops_its_run(project: Path, env: dict[str, str]) -> None:
    started = cli(["run", "--backend", "local", "--gpus", "0", "--noblock", "main.py", "sleep"], project.parent, env)
    run_id = started.stdout.split()[1]
    record = json.loads((Path(env["GPU_OFFLOAD_STATE_DIR"]) / f"{run_id}.json").read_text())
    wait_until(lambda: "tick 1" in Path(record["log"]).read_text(), "the script to run")
    os.kill(record["pid"], signal.SIGTERM)
    wait_until(lambda: runs(project.parent, env)[0]["state"] == "failed", "the run to end")
    assert "interrupted" in Path(record["log"]).read_text()  # stopped through the engine, not killed mid-way


def test_a_noblock_run_keeps_its_queue_timeout_in_the_background_follower() -> None:
    # the detached follower is what waits in the queue: without the option it would wait as long as it takes
    from gpu_offload.cli import build_parser
    from gpu_offload.cli.background import child_argv

    words = ["run", "--noblock", "--queue-timeout", "90", "train.py", "--epochs", "2"]
    follower = child_argv(build_parser(words).parse_args(words), "/tmp/log")
    assert follower[follower.index("--queue-timeout") + 1] == "90.0"
    assert follower[-3:] == ["train.py", "--epochs", "2"]
    assert build_parser(follower[3:]).parse_args(follower[3:]).queue_timeout == 90.0


def test_a_priority_is_checked_as_the_magic_checks_it_and_kept_by_a_background_follower(
        project: Path, env: dict[str, str]) -> None:
    from gpu_offload.cli import build_parser
    from gpu_offload.cli.background import child_argv

    refused = cli(["run", "--backend", "local", "--gpus", "0", "--priority", "Batch!", "main.py"], project.parent, env)
    assert refused.returncode == 2 and refused.stderr.startswith(
        "gpu-offload run: --priority 'Batch!': a priority class is a lowercase name of letters, digits and '-'")
    ran = cli(["run", "--backend", "local", "--gpus", "0", "--priority", "batch", "main.py"], project.parent, env)
    assert ran.returncode == 0 and "the local backend ignores --priority" in ran.stderr, ran.stderr
    words = ["run", "--noblock", "--priority", "batch", "train.py"]
    follower = child_argv(build_parser(words).parse_args(words), "/tmp/log")
    assert build_parser(follower[3:]).parse_args(follower[3:]).priority == "batch"
