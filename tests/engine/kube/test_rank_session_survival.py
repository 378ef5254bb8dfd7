"""Distributed sessions (``--session NAME --nodes N``) outlive their pods as single sessions do (issue 27): each
rank's state is checkpointed to the user's storage as an object of its own, with one record naming all of them;
after an idle release, or its pods stopped during a cell (SIGTERM), the next cell restores rank r's state into
rank r of a new Indexed Job of the same shape, and says what was not restored (a lock, the process group).
Another shape is refused, naming the one it needs. Nothing is left behind: no Job, pod, Service, Secret or
stored object. Small on purpose (2 nodes x 1 rank, no torch but in the one test of torch's process group made
again after a resume): the runner's handling of a process group is tested in tests/runner/test_checkpoint.py.

A donor lost (its node stops answering, the sandbox's ``node-not-ready`` fault, as in test_node_lost.py) while
idle or during a cell: the next cell resumes from the last checkpoint on the other donor and says it was lost. These
and the torch case run on the sandbox only for now (see each test's skip).

The idle release and the SIGTERM case run on the sandbox and on a real cluster (``[real]``, tests/realcluster: real Kubernetes, its Job
controller and kubelet, the storage a moto server on the pods' bridge). The real cluster's stock image is Debian's
Python without numpy (the torch image has it, at 4 GB per node): there each rank's array is a list."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.base import Ranks, RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.errors import OffloadUsageError, RemoteError

from .conftest import BUCKET, STOCK_IMAGE, donor_lost, origin_on_each_cluster, settings
from .helpers import Sink, cell_in_thread, run_cell
from .test_distributed import TORCH_IMAGE, everything_left

DONORS = ("donor-1", "donor-2")
SHAPE = {"gpus": 1, "ranks": Ranks(nodes=2, procs_per_node=1), "timeout": 600}
SETUP = """
import os, threading
rank = int(os.environ["RANK"])
mine = rank * 10 + 1
{array}
guard = threading.Lock()
"""
NUMPY = "import numpy as np\narr = np.arange(3.0) + rank"
LIST = "arr = [float(i + rank) for i in range(3)]"
CHECK = "print(f\"rank {int(os.environ['RANK'])}: {rank} {mine} {float(sum(arr))}\", flush=True)\n"
BEFORE = ["[rank 0] rank 0: 0 1 3.0", "[rank 1] rank 1: 1 11 6.0"]

origin = origin_on_each_cluster()


@pytest.fixture(scope="module")
def setup(origin: Any) -> str:
    """The first cell: each rank's numbers, an array (numpy where the image has it), a lock."""
    return SETUP.format(array=NUMPY if hasattr(origin, "faults") else LIST)


@pytest.fixture(scope="module")
def shape(origin: Any) -> dict[str, Any]:
    """The session's options: on the real cluster pinned to donor-1, the donor whose node is a real kubelet."""
    return SHAPE if hasattr(origin, "faults") else {**SHAPE, "cluster": "donor-1"}


@pytest.fixture()
def kube_idle(api_client: Any, namespace: str, s3: Any, s3_endpoint: str) -> Iterator[KubernetesBackend]:
    """A backend with object storage, trusting both donors, whose sessions are released after 3 s idle;
    afterwards no Job, pod, Service, Secret or stored object is left."""
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         session_idle_timeout=3.0), api_client)
    try:
        yield backend
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def _nothing_left(api_client: Any, namespace: str, s3: Any) -> None:
    """No Job, pod, Service or Secret left in ``namespace``, and no stored object."""
    wait_until(lambda: not everything_left(api_client, namespace), "no Job, pod, Service or Secret left",
               timeout=120)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])] == []


def _lines(sink: Sink) -> list[str]:
    return sorted(sink.text.splitlines())


def _resumed_note(sink: Sink) -> str:
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert "restored from checkpoint ddp: " in note and "arr" in note and "mine" in note, note
    assert "not restored: guard (ranks 0, 1: _thread.lock" in note, note
    assert "process group (the process group and what holds it were not restored" in note, note
    return note


def test_a_distributed_session_released_for_idling_resumes_each_ranks_state_in_the_same_rank(
        kube_idle: KubernetesBackend, api_client: Any, namespace: str, s3: Any, setup: str,
        shape: dict[str, Any]) -> None:
    outcome, sink, _ = run_cell(kube_idle, setup + CHECK, {}, session="ddp", **shape)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert _lines(sink) == BEFORE
    kube_idle.keeper.settle("ddp")  # the automatic checkpoint after the cell
    saved = kube_idle.keeper.store().latest("ddp")
    assert saved is not None and len(saved.rank_objs) == 2 and saved.trusted
    assert [part["rank"] for part in saved.manifest["ranks"]] == [0, 1]
    assert saved.manifest["shape"] == {"nodes": 2, "procs_per_node": 1}
    # one object per rank in the user's storage (the objects of the SIGTERM checkpoint are written only then)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == sorted(saved.rank_objs), keys

    wait_until(lambda: not everything_left(api_client, namespace), "the idle session's Job released", timeout=120)
    status = kube_idle.describe()
    assert "its next cell resumes it from checkpoint ddp (" in status, status

    # another shape is refused before anything is made, naming the shape the checkpoint needs
    with pytest.raises(OffloadUsageError, match=r"resume the session from its last checkpoint ddp"):
        run_cell(kube_idle, CHECK, {}, session="ddp", **{**shape, "ranks": Ranks(nodes=1, procs_per_node=2)})
    with pytest.raises(OffloadUsageError, match=r"checkpoint ddp holds the states of 2 ranks \(--nodes 2 "
                       r"--procs-per-node 1\) and session other has --nodes 1 --procs-per-node 1; restore it into "
                       r"a session of the shape it was written with"):
        kube_idle.restore_session("ddp", "other", RunRequest(gpus=1, ranks=Ranks(nodes=1, procs_per_node=1)))
    assert not everything_left(api_client, namespace)

    outcome, sink, _ = run_cell(kube_idle, CHECK, {}, session="ddp", **shape)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert _lines(sink) == BEFORE  # each rank got its own numbers and array back
    note = _resumed_note(sink)
    assert "was ended after 3 s idle holding 2 GPUs" in note and "its state was checkpointed first" in note, note
    assert kube_idle.close_session("ddp", grace=1)


def test_a_distributed_session_stopped_during_a_cell_resumes_from_what_its_ranks_wrote_at_sigterm(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, setup: str,
        shape: dict[str, Any], origin: Any, request: pytest.FixtureRequest) -> None:
    if not hasattr(origin, "faults"):  # the real cluster: a known bug, kept visible (not skipped)
        request.applymarker(pytest.mark.xfail(strict=False, reason=(
            "known bug seen on the real cluster (final CI of 2026-11-28): the two ranks' pods end one after the "
            "other, the kernel takes the first one's end as a failed rank with the other blocked in a collective "
            "and closes the session, so the SIGTERM records are not used; the sandbox ends both at once")))
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS),
                                api_client)
    try:
        _first_cell(backend, setup, shape)
        cell = "mine = 99 + rank\nprint('changing', flush=True)\nimport time\ntime.sleep(600)\n"
        thread, result, _ = cell_in_thread(backend, cell, "ddp", **shape)
        pods = [p for p in core.list_namespaced_pod(namespace).items]
        assert len(pods) == 2 and all(p.spec.termination_grace_period_seconds == 60 for p in pods)
        for pod in pods:  # a drain of their node: each pod is deleted with its grace period (SIGTERM)
            core.delete_namespaced_pod(pod.metadata.name, namespace)
        thread.join(180)
        assert result["run"][0].status != "ok"
        wait_until(lambda: not core.list_namespaced_pod(namespace).items, "the stopped pods gone", timeout=120)
        outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        # the interrupted cell's change came back on both ranks, each its own
        assert _lines(sink) == ["[rank 0] rank 0: 0 99 3.0", "[rank 1] rank 1: 1 100 6.0"], sink.notices
        note = _resumed_note(sink)
        assert "its runner wrote a checkpoint as the pod was stopped (SIGTERM)" in note, note
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def test_a_distributed_session_moved_to_another_cluster_keeps_each_ranks_state(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    if not hasattr(origin, "faults"):
        pytest.skip("the real cluster here has one real kubelet: no other donor to move the session to")
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS),
                                api_client)
    try:
        outcome, sink, _ = run_cell(backend, setup + CHECK, {}, session="ddp", **shape)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        [here] = {p.spec.node_name for p in core.list_namespaced_pod(namespace).items}
        [there] = [d for d in DONORS if d not in here]
        lines = backend.move_session("ddp", cluster=there, grace=1)
        assert lines[0].startswith("checkpoint ddp (session ddp, written on ") and "mine" in lines[0], lines
        assert f"session ddp: resumed on {there}" in lines[1] and "restored from checkpoint ddp: " in lines[1], lines
        nodes = {p.spec.node_name for p in core.list_namespaced_pod(namespace).items
                 if not p.metadata.deletion_timestamp}
        assert len(nodes) == 1 and there in nodes.pop()
        outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)  # the first placement still fits
        assert outcome.status == "ok" and _lines(sink) == BEFORE, (outcome.error, sink.text, sink.notices)
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def _sandbox_only(origin: Any, why: str) -> None:
    if not hasattr(origin, "faults"):
        pytest.skip(why)


def _first_cell(backend: KubernetesBackend, setup: str, shape: dict[str, Any]) -> None:
    """The session's first cell (each rank's numbers, array and lock), and its automatic checkpoint written."""
    outcome, sink, _ = run_cell(backend, setup + CHECK, {}, session="ddp", **shape)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    backend.keeper.settle("ddp")


def _live_nodes(core: Any, namespace: str) -> set[str]:
    """The nodes of the session's pods not being deleted (a lost node's pods stay Terminating until it is back)."""
    return {p.spec.node_name for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp}


def test_a_distributed_session_whose_donor_is_lost_resumes_elsewhere_from_its_last_checkpoint(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    _sandbox_only(origin, "not run on the real cluster yet: this module's session is pinned to donor-1 there, and "
                          "a lost donor's session resumes on another donor")
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         node_lost_seconds=2), api_client)
    try:
        _first_cell(backend, setup, shape)
        [node] = _live_nodes(core, namespace)
        with donor_lost(origin, node, grace=0):
            # both pods are evicted once their 2 s toleration of the unreachable node runs out; no SIGTERM reaches
            # their ranks, so the last checkpoint (after the first cell) is what comes back
            wait_until(lambda: not backend.sessions(), "the session seen as lost", timeout=240)
            outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)
            assert outcome.status == "ok", (outcome.error, sink.notices)
            assert _lines(sink) == BEFORE, sink.notices  # each rank got its own numbers and array back
            note = _resumed_note(sink)
            assert f"was lost with the virtual node of {node.removesuffix('-gpu')} while idle; resumed on " in note, note
            assert "SIGTERM" not in note, note
            [there] = _live_nodes(core, namespace)
            assert there != node
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def test_a_distributed_session_whose_donor_is_lost_during_a_cell_says_so_and_resumes_from_before_the_cell(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    _sandbox_only(origin, "not run on the real cluster yet: this module's session is pinned to donor-1 there, and "
                          "a lost donor's session resumes on another donor")
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         node_lost_seconds=2), api_client)
    try:
        _first_cell(backend, setup, shape)
        [node] = _live_nodes(core, namespace)
        cell = "mine = 99 + rank\nprint('changing', flush=True)\nimport time\ntime.sleep(600)\n"
        thread, result, told = cell_in_thread(backend, cell, "ddp", **shape)
        with donor_lost(origin, node, grace=0):
            thread.join(240)
            assert not thread.is_alive(), "the cell did not end when its donor was lost"
            failed = result["run"][0].error
            assert isinstance(failed, RemoteError), (failed, told.notices)
            assert f"the virtual node of {node.removesuffix('-gpu')} was lost ({node} stopped answering" in \
                failed.evalue, failed
            # the ranks ended with their pods: none is said to be stuck in a collective, nor the state to be gone
            assert not [n for n in told.notices if "did not stop" in n or "state is gone" in n], told.notices
            wait_until(lambda: not backend.sessions(), "the session seen as lost", timeout=120)
            outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)
            assert outcome.status == "ok", (outcome.error, sink.notices)
            assert _lines(sink) == BEFORE, sink.notices  # what the lost cell changed is lost with it
            note = _resumed_note(sink)
            assert f"was lost with the virtual node of {node.removesuffix('-gpu')} during a cell; resumed on " in \
                note, note
            [there] = _live_nodes(core, namespace)
            assert there != node
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def _neighbour(gpus: int, node: str) -> dict[str, Any]:
    """Another user's pod holding ``gpus`` of ``node``'s GPUs."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "neighbour"},
            "spec": {"nodeName": node, "containers": [{
                "name": "c", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(600)"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                 "effect": "NoExecute"}]}}


def test_a_spread_session_one_of_whose_donors_is_lost_during_a_cell_resumes_from_before_the_cell(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    """One pod lost with its node, the other rank alive in the cell: the session ends at once (the live rank's pod
    is stopped), and as the lost rank wrote no record at SIGTERM the last checkpoint of all ranks comes back."""
    _sandbox_only(origin, "not run on the real cluster yet: it needs two real kubelets and a lost one")
    core.create_namespaced_pod(namespace, _neighbour(5, "donor-2-gpu"))
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         node_lost_seconds=2), api_client)
    try:
        # donor-2 has 3 of its 8 GPUs free, donor-1 its 4: two pods of 3 GPUs fit only one on each
        wait_until(lambda: any(vn.name == "donor-2-gpu" and vn.free == 3
                               for vn in backend.inventory().inventory().virtual_nodes),
                   "the kernel sees the neighbour's GPUs in use")
        spread = {**shape, "gpus": 3, "ranks": Ranks(nodes=2, procs_per_node=1, spread=True)}
        outcome, sink, _ = run_cell(backend, setup + CHECK, {}, session="ddp", **spread)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        backend.keeper.settle("ddp")
        assert _live_nodes(core, namespace) == {"donor-1-gpu", "donor-2-gpu"}
        core.delete_namespaced_pod("neighbour", namespace, grace_period_seconds=0)  # room for the resume
        cell = "mine = 99 + rank\nprint('changing', flush=True)\nimport time\ntime.sleep(600)\n"
        thread, result, told = cell_in_thread(backend, cell, "ddp", **spread)
        with donor_lost(origin, "donor-1-gpu", grace=0):
            thread.join(240)
            assert not thread.is_alive(), "the cell did not end when one of its donors was lost"
            failed = result["run"][0].error
            assert isinstance(failed, RemoteError), (failed, told.notices)
            # a spread Job's pods share one context: the cluster is named as "donor-1 or donor-2", the node exactly
            assert " was lost (donor-1-gpu stopped answering and Kubernetes evicted" in failed.evalue, failed
            assert not [n for n in told.notices if "did not stop" in n or "state is gone" in n], told.notices
            wait_until(lambda: not backend.sessions(), "the session seen as lost", timeout=120)
            # the live rank's pod ends in its grace period (SIGTERM: it writes its record), and frees donor-2's GPUs
            wait_until(lambda: any(vn.name == "donor-2-gpu" and vn.free == 8
                                   for vn in backend.inventory().inventory().virtual_nodes),
                       "the live rank's pod gone from donor-2", timeout=120)
            outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **spread)
            assert outcome.status == "ok", (outcome.error, sink.notices)
            assert _lines(sink) == BEFORE, sink.notices  # the live rank's record alone is not used
            [note] = [n for n in sink.notices if "resumed on" in n]
            assert "was lost with the virtual node of donor-1 or donor-2 during a cell; resumed on " in note, note
            assert "SIGTERM" not in note, note
            assert _live_nodes(core, namespace) == {"donor-2-gpu"}
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
        with contextlib.suppress(kubernetes.client.ApiException):  # deleted above unless the test failed first
            core.delete_namespaced_pod("neighbour", namespace, grace_period_seconds=0)
    _nothing_left(api_client, namespace, s3)


GROUP = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
mine = torch.arange(3.0) + rank
torch.manual_seed(rank)
model = torch.nn.Linear(3, 1)
weights = round(float(model.weight.detach().sum()), 5)
print(f"rank {rank}: {total.item()} {weights}", flush=True)
"""
REDUCE = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
again = not dist.is_initialized()
dist.init_process_group("gloo")
both = mine.clone()
dist.all_reduce(both)
own = round(float(model.weight.detach().sum()), 5) == weights
ddp = DistributedDataParallel(model)  # the wrapper built again from the module that came back, as docs say
ddp(torch.ones(1, 3) * (rank + 1)).sum().backward()  # gradients averaged over the new group: (1 + 2) / 2 each
grad = round(float(model.weight.grad.sum()), 5)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: {again} {total.item()} {mine.tolist()} {both.tolist()} "
      f"{own} {grad}", flush=True)
"""


def test_a_resumed_distributed_session_makes_its_process_group_again_and_its_tensors_came_back(
        kube_idle: KubernetesBackend, api_client: Any, namespace: str, origin: Any, shape: dict[str, Any]) -> None:
    _sandbox_only(origin, "not run on the real cluster yet: no test there has made a gloo process group between "
                          "ranks' pods (its stock image has no torch; the torch image is 4 GB per node)")
    torch_shape = {**shape, "image": TORCH_IMAGE}
    outcome, sink, _ = run_cell(kube_idle, GROUP, {}, session="ddp", **torch_shape)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    lines = _lines(sink)
    assert [line.rsplit(" ", 1)[0] for line in lines] == ["[rank 0] rank 0: 3.0", "[rank 1] rank 1: 3.0"], lines
    assert len({line.rsplit(" ", 1)[1] for line in lines}) == 2, lines  # each rank its own model
    kube_idle.keeper.settle("ddp")
    wait_until(lambda: not everything_left(api_client, namespace), "the idle session's Job released", timeout=120)

    outcome, sink, _ = run_cell(kube_idle, REDUCE, {}, session="ddp", **torch_shape)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    # new processes (no group until the cell made one), which joins both ranks again; each rank's tensors and
    # model came back, its own; DDP wrapped around the restored module averages the ranks' gradients
    assert _lines(sink) == ["[rank 0] rank 0 of 2: True 3.0 [0.0, 1.0, 2.0] [1.0, 3.0, 5.0] True 4.5",
                            "[rank 1] rank 1 of 2: True 3.0 [1.0, 2.0, 3.0] [1.0, 3.0, 5.0] True 4.5"], sink.notices
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert "restored from checkpoint ddp: " in note and "total" in note and "model" in note, note
    assert "call dist.init_process_group() again" in note, note
    assert kube_idle.close_session("ddp", grace=1)


def test_a_distributed_session_on_a_cordoned_node_is_moved_with_each_ranks_state(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    _sandbox_only(origin, "the real cluster here has one real kubelet: no other donor to move the session to")
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS),
                                api_client)
    try:
        _first_cell(backend, setup, shape)
        [node] = _live_nodes(core, namespace)
        cluster = node.removesuffix("-gpu")
        core.patch_node(node, {"spec": {"unschedulable": True}})  # its donor drained: both pods' node cordoned
        try:
            wait_until(lambda: any(vn.name == node and vn.cordoned
                                   for vn in backend.inventory().inventory().virtual_nodes), "the cordon seen")
            outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)
            assert outcome.status == "ok" and _lines(sink) == BEFORE, (outcome.error, sink.text, sink.notices)
            [note] = [n for n in sink.notices if "is being drained" in n]
            assert (f"session ddp: donor {cluster} is being drained (its node {node} is cordoned); moved this "
                    f"session from {cluster} to ") in note and "restored from checkpoint ddp: " in note, note
            [there] = _live_nodes(core, namespace)
            assert there != node
        finally:
            core.patch_node(node, {"spec": {"unschedulable": None}})
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)


def test_a_distributed_session_with_nowhere_else_to_go_stays_on_its_cordoned_node_and_says_so(
        api_client: Any, core: Any, namespace: str, s3: Any, s3_endpoint: str, origin: Any, setup: str,
        shape: dict[str, Any]) -> None:
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS),
                                api_client)
    try:
        _first_cell(backend, setup, shape)
        [node] = _live_nodes(core, namespace)
        cluster = node.removesuffix("-gpu")
        job = backend.sessions()[0].where
        # every node the session may go to cordoned: its own (on the real cluster it is pinned to donor-1), and on
        # the sandbox the other donor's too
        cordoned = [node] if "cluster" in shape else [f"{d}-gpu" for d in DONORS]
        for name in cordoned:
            core.patch_node(name, {"spec": {"unschedulable": True}})
        try:
            # said while it idles, by the drain watch (no cell runs)
            stays = (f"donor {cluster} is being drained (its node {node} is cordoned), and no other donor has room "
                     "for it (--gpus 1 --nodes 2")
            [line] = wait_until(lambda: [s.release for s in backend.sessions() if stays in s.release],
                                "the idle session's line saying it stays", timeout=60)
            assert "it stays until its pod is evicted; its next cell then resumes it from its checkpoint" in line
            outcome, sink, _ = run_cell(backend, CHECK, {}, session="ddp", **shape)
            assert outcome.status == "ok" and _lines(sink) == BEFORE, (outcome.error, sink.text, sink.notices)
            [note] = [n for n in sink.notices if "is being drained" in n]
            assert (f"session ddp: donor {cluster} is being drained (its node {node} is cordoned), and no other donor "
                    "has room for this session") in note and "the cell runs there" in note, note
            assert [s.where for s in backend.sessions()] == [job]  # not moved
        finally:
            for name in cordoned:
                core.patch_node(name, {"spec": {"unschedulable": None}})
        assert backend.close_session("ddp", grace=1)
    finally:
        backend.close()
    _nothing_left(api_client, namespace, s3)
