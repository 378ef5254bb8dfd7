"""Distributed sessions (``--session NAME --nodes N``) on the kubernetes backend through the sandbox, with the
real engine and runner: the ranks of an Indexed Job's pods keep their state (and their gloo process group)
across cells sent through one attachment per pod; a rank that raises while the other waits in a collective
fails the cell naming the rank and closes the session, whose next cell starts anew; closing leaves no Job, pod,
Service or Secret."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError, RemoteError

from .conftest import settings
from .helpers import Sink, run_cell
from .test_distributed import TORCH_IMAGE, everything_left

TWO_NODES = Ranks(nodes=2, procs_per_node=1)
SHAPE = {"image": TORCH_IMAGE, "gpus": 1, "ranks": TWO_NODES, "timeout": 600}
COUNT = "count += 1\nprint(f'rank {dist.get_rank()} of {dist.get_world_size()}: cell {count}', flush=True)\n"


def pods_of(api_client: Any, namespace: str) -> list[str]:
    return sorted(name for name in everything_left(api_client, namespace) if name.startswith("pod/"))


def test_a_distributed_session_keeps_every_ranks_state_across_three_cells_and_close_leaves_nothing(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    # each cell gets a fresh notebook namespace: nothing goes back to the ranks as an input, so whatever a
    # rank knows in the next cell it kept itself
    first: dict[str, Any] = {}
    build = "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\ncount = 0\n" + COUNT
    outcome, sink, _ = run_cell(kube, build, first, session="ddp", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == ["[rank 0] rank 0 of 2: cell 1", "[rank 1] rank 1 of 2: cell 1"]
    pods = pods_of(api_client, namespace)
    assert len(pods) == 2

    outcome, sink, _ = run_cell(kube, COUNT, {}, session="ddp", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == ["[rank 0] rank 0 of 2: cell 2", "[rank 1] rank 1 of 2: cell 2"]

    # the process group made in the first cell still joins both ranks
    last: dict[str, Any] = {}
    reduce = COUNT + ("total = torch.tensor([float(count * (dist.get_rank() + 1))])\ndist.all_reduce(total)\n"
                      "result = (dist.get_rank(), count, int(total.item()))\n")
    outcome, sink, _ = run_cell(kube, reduce, last, session="ddp", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == ["[rank 0] rank 0 of 2: cell 3", "[rank 1] rank 1 of 2: cell 3"]
    assert last["result"] == (0, 3, 3 * 1 + 3 * 2)  # rank 0's variables; the sum of both ranks' counts
    assert pods_of(api_client, namespace) == pods  # the same two pods ran every cell

    [info] = kube.sessions()
    assert (info.name, info.runs, info.busy) == ("ddp", 3, False) and "2 pods" in info.where
    # another shape is refused until the session is closed, and nothing new is made
    with pytest.raises(OffloadUsageError, match="Session `ddp` was started with --gpus 1 --nodes 2"):
        run_cell(kube, COUNT, {}, session="ddp", **{**SHAPE, "ranks": Ranks(nodes=1, procs_per_node=1)})
    assert pods_of(api_client, namespace) == pods

    assert kube.close_session("ddp", grace=1)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_a_rank_that_raises_while_the_other_waits_in_a_collective_closes_the_session(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "import torch.distributed as dist\ndist.init_process_group('gloo')", {},
                             session="broken", **SHAPE)
    assert outcome.status == "ok", outcome.error
    user_ns: dict[str, Any] = {"result": "before"}
    cell = "if dist.get_rank() == 1:\n    raise ValueError('rank one gives up')\ndist.barrier()\nresult = 'after'\n"
    outcome, sink, _ = run_cell(kube, cell, user_ns, session="broken", **SHAPE)
    assert isinstance(outcome.error, RemoteError), outcome
    assert outcome.error.ename == "ValueError" and "[rank 1]" in outcome.error.evalue
    assert "rank 1 of 2 (node 1) failed" in "".join(outcome.error.traceback)
    # rank 0 waits in the barrier for ever: after the grace period the session is closed, saying so
    assert any("rank 0 (node 0) did not stop" in n and "the session was closed" in n for n in sink.notices), \
        sink.notices
    assert user_ns["result"] == "before"
    assert not kube.sessions()
    wait_until(lambda: not everything_left(api_client, namespace), "the closed session's Job and all it owns deleted",
               timeout=120)

    # the next cell starts the session anew, and says that the old state is gone
    outcome, sink, _ = run_cell(kube, "import os\nprint('fresh', os.environ['RANK'], flush=True)", {},
                                session="broken", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert any("was closed when its ranks did not stop" in n and "variables of the old one are gone" in n
               for n in sink.notices), sink.notices
    assert sorted(sink.text.splitlines()) == ["[rank 0] fresh 0", "[rank 1] fresh 1"]
    assert kube.close_session("broken", grace=1)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_ctrl_c_interrupts_every_ranks_cell_and_the_session_keeps_its_state(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "kept = 40", {}, session="calm", **SHAPE)
    assert outcome.status == "ok", outcome.error
    waiting: list[str] = []

    def interrupt(text: str) -> None:
        waiting.extend(line for line in text.splitlines() if "waiting" in line)
        if len(waiting) == 2:  # both ranks are in the cell
            raise KeyboardInterrupt

    cell = "import os, time\nprint('waiting', os.environ['RANK'], flush=True)\ntime.sleep(600)\nkept = 0\n"
    with pytest.raises(KeyboardInterrupt):
        run_cell(kube, cell, {}, Sink(on_line=interrupt), session="calm", **SHAPE)
    outcome, sink, _ = run_cell(kube, "import os\nprint(kept + 1 + int(os.environ['RANK']), flush=True)", {},
                                session="calm", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == ["[rank 0] 41", "[rank 1] 42"]
    [info] = kube.sessions()
    assert info.runs == 3
    assert kube.close_session("calm", grace=1)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_the_kernels_shutdown_deletes_a_distributed_sessions_job_pods_service_and_secret(
        api_client: Any, namespace: str) -> None:
    backend = KubernetesBackend(settings(namespace), api_client)
    try:
        outcome, _, _ = run_cell(backend, "kept = 1", {}, session="left", **SHAPE)
        assert outcome.status == "ok", outcome.error
        assert len(pods_of(api_client, namespace)) == 2
    finally:
        backend.close()
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_a_distributed_session_whose_pod_is_lost_while_idle_is_started_anew_and_the_user_told(
        kube: KubernetesBackend, api_client: Any, core: Any, namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "kept = 1", {}, session="fragile", **SHAPE)
    assert outcome.status == "ok", outcome.error
    [job] = [name for name in everything_left(api_client, namespace) if name.startswith("job/")]
    lost = pods_of(api_client, namespace)[1].removeprefix("pod/")
    core.delete_namespaced_pod(lost, namespace, grace_period_seconds=0)  # e.g. an admin, a drain
    wait_until(lambda: not kube.sessions(), "the session seen as ended")
    # a cell with other options is refused; the refusal says what the session's options would do: this kernel has
    # no object storage, so the session has no checkpoint and starts again empty (not "resume ... from its last
    # checkpoint"; with storage it resumes: test_rank_session_survival.py)
    with pytest.raises(OffloadUsageError) as refused:
        run_cell(kube, "print(kept)", {}, session="fragile", **{**SHAPE, "gpus": 2})
    assert ("Run it with the session's options to start the session again in a new Job, empty: this kernel has no "
            "object storage to checkpoint to, so its variables are gone, or close it with "
            "`%gpu_offload close fragile`") in str(refused.value), refused.value
    assert "checkpoint (" not in str(refused.value) and "resume" not in str(refused.value), refused.value
    outcome, sink, _ = run_cell(kube, "print(kept)", {}, session="fragile", **SHAPE)
    assert any(f"its Job {job.removeprefix('job/')} ended while idle" in n for n in sink.notices), sink.notices
    assert outcome.error is not None and "kept" in str(outcome.error)  # fresh namespaces: NameError
    wait_until(lambda: job not in everything_left(api_client, namespace), "the old Job deleted with its session",
               timeout=120)
    assert kube.close_session("fragile", grace=1)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_the_magic_keeps_a_distributed_session_across_three_cells_and_closes_it(
        shell: Any, api_client: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = f"--session ddp --nodes 2 --gpus 1 --image {TORCH_IMAGE} --timeout 600"
    shell.run_cell_magic("gpu_offload", line, "import torch, torch.distributed as dist\ndist.init_process_group('gloo')")
    # the process group of the first cell joins the ranks in the second and third
    shell.run_cell_magic("gpu_offload", line, "seen = torch.tensor([float(dist.get_rank() + 1)])\ndist.all_reduce(seen)")
    shell.run_cell_magic("gpu_offload", line, "print('world', dist.get_world_size(), flush=True)\n"
                                               "total = int(seen.item()) * 10 + dist.get_rank()")
    assert shell.user_ns["total"] == 30  # (1 + 2) * 10 on rank 0, whose variables come back
    out = capsys.readouterr().out
    assert "[rank 0] world 2" in out and "[rank 1] world 2" in out
    shell.run_line_magic("gpu_offload", "sessions")
    assert "ddp" in capsys.readouterr().out
    shell.run_line_magic("gpu_offload", "close ddp")
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)


def test_a_rank_that_raises_while_the_other_can_stop_fails_the_cell_and_the_session_keeps_its_state(
        kube: KubernetesBackend, api_client: Any, namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "import os, time\nkept = 40 + int(os.environ['RANK'])", {}, session="sturdy",
                             **SHAPE)
    assert outcome.status == "ok", outcome.error
    pods = pods_of(api_client, namespace)
    # rank 0 sleeps (an interrupt stops it), rank 1 raises
    cell = "if os.environ['RANK'] == '1':\n    raise ValueError('rank one gives up')\ntime.sleep(600)\n"
    outcome, sink, _ = run_cell(kube, cell, {}, session="sturdy", **SHAPE)
    assert isinstance(outcome.error, RemoteError), outcome
    assert outcome.error.ename == "ValueError" and "[rank 1]" in outcome.error.evalue
    assert not any("the session was closed" in n for n in sink.notices), sink.notices
    outcome, sink, _ = run_cell(kube, "print(kept, flush=True)", {}, session="sturdy", **SHAPE)
    assert outcome.status == "ok", outcome.error
    assert sorted(sink.text.splitlines()) == ["[rank 0] 40", "[rank 1] 41"]
    assert pods_of(api_client, namespace) == pods  # the same session, not a new one
    assert kube.close_session("sturdy", grace=1)
    wait_until(lambda: not everything_left(api_client, namespace), "Job, pods, Service and Secret deleted",
               timeout=120)
