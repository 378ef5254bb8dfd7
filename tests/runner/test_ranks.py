"""A node launcher (the runner given a bundle with ``ranks``) and the decoding of many ranks' frames."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import (
    MAX_FRAME_BYTES,
    DisplayData,
    Done,
    Error,
    FrameDecoder,
    FrameEncoder,
    Hello,
    Noise,
    Outputs,
    Stream,
)
from gpu_offload.runner.wire import RELAY_ROOM

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

HANG_GUARD = 120.0


def launch(runner_pyz: Path, bundle: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(runner_pyz), "--bundle", "-", *args], input=encode_bundle(bundle),
                          capture_output=True, timeout=HANG_GUARD, env=env)


def test_a_node_runs_its_ranks_and_relays_their_frames_in_one_order(runner_pyz: Path) -> None:
    # each rank sends a display larger than one frame: the parts pass the launcher intact
    cell = "import os\nrank = int(os.environ['RANK'])\nprint('rank', rank)\ndisplay({'text/plain': 'x' * 40000}, raw=True)"
    bundle = make_bundle(cell, outputs=["rank"], output_transport="inline",
                         ranks={"nodes": 2, "procs_per_node": 2, "out_rank": 3})
    done = launch(runner_pyz, bundle, "--group-rank", "1",
                  env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split(b"\n")[:-1]
    assert max(len(line) + 1 for line in lines) <= MAX_FRAME_BYTES
    seqs = [int(line.split(b" ")[2]) for line in lines]
    assert seqs == list(range(len(lines)))  # one order: what a resumed log stream relies on
    events = FrameDecoder(bundle["nonce"], run_id=bundle["run_id"], ranks=4).feed(done.stdout)
    assert sorted(e.rank for e in events if isinstance(e, Hello)) == [2, 3]  # node 1 runs ranks 2 and 3
    assert sorted((e.rank, e.text) for e in events if isinstance(e, Stream)) == [(2, "rank 2\n"), (3, "rank 3\n")]
    assert sorted(e.rank for e in events if isinstance(e, DisplayData) and len(e.data["text/plain"]) == 40000) == [2, 3]
    assert [e.rank for e in events if isinstance(e, Outputs)] == [3]  # only the out rank sends variables
    assert sorted((e.rank, e.status) for e in events if isinstance(e, Done)) == [(2, "ok"), (3, "ok")]


def test_a_rank_that_dies_without_finishing_is_reported_by_its_launcher(runner_pyz: Path) -> None:
    cell = "import os\nif os.environ['RANK'] == '1':\n    os._exit(7)\nprint('fine')"
    bundle = make_bundle(cell, ranks={"nodes": 1, "procs_per_node": 2, "out_rank": 0})
    done = launch(runner_pyz, bundle)
    assert done.returncode == 7
    events = FrameDecoder(bundle["nonce"], run_id=bundle["run_id"], ranks=2).feed(done.stdout)
    errors = [e for e in events if isinstance(e, Error)]
    assert [(e.rank, e.ename) for e in errors] == [(1, "RankDied")]
    assert "the process of rank 1 (node 0) ended before its cell finished (exit code 7)" in errors[0].evalue
    assert sorted((e.rank, e.status) for e in events if isinstance(e, Done)) == [(0, "ok"), (1, "error")]


@pytest.mark.parametrize(("args", "message"), [
    ((), "a 2-node run needs this node's group rank: pass --group-rank G or run it as a pod of an Indexed Job"),
    (("--group-rank", "2"), "--group-rank 2 is outside the run's 2 node(s)"),
])
def test_a_launcher_without_its_place_refuses_before_any_rank_starts(
    runner_pyz: Path, args: tuple[str, ...], message: str
) -> None:
    bundle = make_bundle("print('never')", ranks={"nodes": 2, "procs_per_node": 2, "out_rank": 0})
    env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    done = launch(runner_pyz, bundle, *args, env=env)
    assert done.returncode == 2 and done.stdout == b""
    assert message in done.stderr.decode()


def test_an_indexed_jobs_completion_index_is_the_group_rank(runner_pyz: Path) -> None:
    bundle = make_bundle("import os\nprint(os.environ['GROUP_RANK'], os.environ['RANK'])",
                         ranks={"nodes": 3, "procs_per_node": 1, "out_rank": 0})
    env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": "2"}
    done = launch(runner_pyz, bundle, env=env)
    events = FrameDecoder(bundle["nonce"], ranks=3).feed(done.stdout)
    assert [(e.rank, e.text) for e in events if isinstance(e, Stream)] == [(2, "2 2\n")]


def test_frames_of_a_rank_outside_the_run_are_not_events() -> None:
    nonce = secrets.token_hex(16)
    lines: list[bytes] = []
    FrameEncoder(nonce, lines.append, rank=4).emit("stream", name="stdout", text="forged")
    FrameEncoder(nonce, lines.append, rank=3).emit("stream", name="stdout", text="real")
    events = FrameDecoder(nonce, ranks=4).feed(b"".join(lines))
    assert isinstance(events[0], Noise) and "outside this run's 4 rank(s)" in events[0].reason
    assert events[1] == Stream(0, "stdout", "real", rank=3)
    assert isinstance(FrameDecoder(nonce).feed(lines[1])[0], Noise)  # a single runner is rank 0 only


def test_two_ranks_large_events_interleaved_line_by_line_are_both_reassembled() -> None:
    nonce = secrets.token_hex(16)
    per_rank = []
    for rank in (0, 1):
        lines: list[bytes] = []
        FrameEncoder(nonce, lines.append, limit=MAX_FRAME_BYTES - RELAY_ROOM, rank=rank).emit(
            "display_data", data={"text/plain": str(rank) * 50000}, metadata={})
        per_rank.append(lines)
    assert len(per_rank[0]) == len(per_rank[1]) > 2
    # as a launcher relays them: alternating, with its own seq
    mixed = []
    for seq, line in enumerate(line for pair in zip(*per_rank, strict=True) for line in pair):
        fields = line.split(b" ", 3)
        mixed.append(b" ".join([fields[0], fields[1], str(seq).encode(), fields[3]]))
    events = FrameDecoder(nonce, ranks=2).feed(b"".join(mixed))
    assert sorted((e.rank, e.data["text/plain"][:1]) for e in events if isinstance(e, DisplayData)) == [
        (0, "0"), (1, "1")]
    assert all(isinstance(e, DisplayData) for e in events)
