"""``gpu-offload run SCRIPT --nodes N`` on the local backend: the script runs as every rank, as torchrun runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import cli, environment

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

SCRIPT = """\
import os, sys
rank = int(os.environ["RANK"])
print("rank", rank, "of", os.environ["WORLD_SIZE"], sys.argv[1:])
if rank == 3 and sys.argv[1:] == ["fail"]:
    sys.exit(5)
"""


def test_a_script_runs_as_every_rank_and_a_ranks_exit_code_is_the_commands(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "ranks.py").write_text(SCRIPT)
    env = environment(tmp_path / "state")
    shape = ["--nodes", "2", "--procs-per-node", "2", "--gpus", "0"]
    done = cli(["run", "--backend", "local", *shape, "ranks.py", "ok"], tmp_path / "proj", env)
    assert done.returncode == 0, done.stderr
    for rank in range(4):
        assert f"[rank {rank}] rank {rank} of 4 ['ok']" in done.stdout
    failed = cli(["run", "--backend", "local", *shape, "ranks.py", "fail"], tmp_path / "proj", env)
    assert failed.returncode == 5, failed.stderr


def test_spread_is_taken_and_kept_by_a_background_follower_and_the_local_backend_says_it_ignores_it(
        tmp_path: Path) -> None:
    from gpu_offload.cli import build_parser
    from gpu_offload.cli.background import child_argv

    words = ["run", "--noblock", "--nodes", "2", "--gpus", "1", "--spread", "train.py"]
    follower = child_argv(build_parser(words).parse_args(words), "/tmp/log")
    assert build_parser(follower[3:]).parse_args(follower[3:]).spread
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "ranks.py").write_text(SCRIPT)
    done = cli(["run", "--backend", "local", "--nodes", "2", "--procs-per-node", "1", "--gpus", "0", "--spread",
                "ranks.py", "ok"], tmp_path / "proj", environment(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert "the local backend ignores --spread" in done.stdout + done.stderr
    assert "[rank 1] rank 1 of 2 ['ok']" in done.stdout
