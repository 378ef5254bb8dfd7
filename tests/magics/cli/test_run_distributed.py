"""``gpu-offload run SCRIPT --nodes N`` on the local backend: the script runs as every rank, as torchrun runs it."""

from __future__ import annotations

from pathlib import Path

from .helpers import cli, environment

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
