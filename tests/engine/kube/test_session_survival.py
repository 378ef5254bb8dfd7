"""Sessions on the cluster outlive their pods (issue 27): a session holding numbers, a numpy array, a torch
model with its optimizer and a function from an earlier cell is checkpointed to the user's storage after each
cell that changed it; when its donor is lost, drained, or the session is released for idling or moved, the
next cell sees the same values and says what happened and what was (not) restored. Nothing is left behind:
no pod, Secret or stored object.

Every case runs on the sandbox and on a real cluster (``[real]``, tests/realcluster): real Kubernetes and real
Kueue, a real kubelet per donor, both with the torch image (tests/realcluster/torch_image.sh). There a lost donor
is a killed kubelet (its containers run on, the node controller evicts the pod after its grace), a drain cordons
the real node and evicts the pod through the Eviction API, as `kubectl drain` does (its grace period: SIGTERM), and the storage is a moto server on the pods'
bridge, reached by the kernel and by the real pods through presigned URLs as on the sandbox. The preemption by a
higher-priority run is in test_preemption.py (its queued pool), on both clusters too. Three tests of decisions the
kernel alone makes (a refused cell, a session's own idle timeout listed, a forged record) run on the sandbox only,
to keep the real stage short: the releases and resumes they follow run on ``[real]`` in the others."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.objectstore import s3_server

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.errors import OffloadUsageError

from ...realcluster.realorigin import torch_image
from .conftest import BUCKET, donor_lost, leftovers, origin_on_each_cluster, settings
from .helpers import Sink, cell_in_thread, run_cell

TORCH_IMAGE = "pytorch/pytorch:2.5"
"""An image name the sandbox runs with torch and numpy installed (its ``*pytorch*`` mapping)."""
DONORS = ("donor-1", "donor-2")
SETUP = """
import threading
import numpy as np
import torch
n = 41
arr = np.arange(6.0).reshape(2, 3)
def double(x):
    return 2 * x
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.ones(1, 3)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
guard = threading.Lock()
"""
CHECK = """
print(n, arr.sum(), double(21), opt.param_groups[0]['params'][0] is model.weight, len(opt.state),
      round(float(model.weight.detach().sum()), 5), round(float(opt.state[model.weight]['exp_avg'].sum()), 5))
"""


origin = origin_on_each_cluster()


@pytest.fixture(scope="module")
def s3_endpoint(origin: Any) -> Iterator[str]:
    """Object storage (a moto server) on this module's origin's pod network: the kernel and the pods reach it."""
    with s3_server(origin.host_address) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def where(origin: Any, api_client: Any) -> dict[str, Any]:
    """How the session's cells are placed: the sandbox maps a pytorch image to its torch venv on any donor; on
    the real cluster the torch image must be on both donors' nodes (a session moves between them)."""
    if hasattr(origin, "faults"):
        return {"image": TORCH_IMAGE}
    return {"image": torch_image(api_client, nodes=len(DONORS))}


def kernel_side_only(origin: Any) -> None:
    """Skip on the real cluster a test whose behaviour is the kernel's alone once the release or the pod's end it
    follows is proven there by the other tests: the real stage stays short."""
    if not hasattr(origin, "faults"):
        pytest.skip("the kernel's own decision (refusal, listing, a record in storage), the same on both clusters; "
                    "the release and the resume it follows run on [real] in the other tests")


@pytest.fixture()
def kube_s3(api_client: Any, namespace: str, s3: Any, s3_endpoint: str, core: Any) -> Iterator[KubernetesBackend]:
    """A backend with object storage that trusts both donors; afterwards no pod, Secret or object is left."""
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                               node_lost_seconds=2),
                                api_client)
    yield backend
    backend.close()
    # a pod left Terminating on a lost node goes once its kubelet is back
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=120)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def _start(kube: KubernetesBackend, where: dict[str, Any]) -> str:
    """The session's state made in a first cell; what the check cell prints of it."""
    # one cell: a short idle timeout must not release the session between making the state and reading it
    outcome, sink, _ = run_cell(kube, SETUP + CHECK, {}, session="train", **where)
    assert outcome.status == "ok", outcome.error
    assert sink.text.startswith("41 15.0 42 True 2 "), sink.text
    kube.keeper.settle("train")  # the automatic checkpoint after the last cell is written
    return sink.text


def _pod(core: Any, namespace: str) -> Any:
    """The session's one pod not being deleted (a lost node's old pod stays Terminating until its kubelet is back)."""
    [pod] = [p for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp]
    return pod


def _check_resumed(kube: KubernetesBackend, before: str, happened: str, where: dict[str, Any]) -> Sink:
    outcome, sink, _ = run_cell(kube, CHECK, {}, session="train", **where)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sink.text == before, (sink.text, sink.notices)
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert happened in note, note
    assert "restored from checkpoint train: " in note and "model" in note and "opt" in note and "double" in note
    assert "not restored: guard (_thread.lock" in note and "waited" in note and "the restore took" in note, note
    # said before the wait for the new pod and the restore: what comes back, its size, and how long it should take
    [told] = [n for n in sink.notices if "restoring checkpoint train (" in n]
    assert sink.notices.index(told) < sink.notices.index(note), sink.notices
    assert told.startswith("session train: ") and happened in told, told
    assert re.search(r"restoring checkpoint train \(\d+(\.\d)? (MiB|KiB|bytes)\) once the new pod runs; ", told), told
    assert "; it should take " in told or "; no estimate of its time yet: " in told, told
    return sink


def test_a_session_survives_its_donor_being_lost(kube_s3: KubernetesBackend, core: Any, namespace: str,
                                                  origin: Any, where: dict[str, Any]) -> None:
    before = _start(kube_s3, where)
    node = _pod(core, namespace).spec.node_name
    with donor_lost(origin, node, grace=0):
        # the pod is evicted once its 2 s toleration of the unreachable node runs out (on the real cluster after
        # the node controller's 50 s; the pod then stays Terminating there, nobody on the node confirming)
        wait_until(lambda: not kube_s3.sessions(), "the session seen as lost", timeout=240)
        sink = _check_resumed(kube_s3, before, "was lost with the virtual node of", where)
        assert _pod(core, namespace).spec.node_name != node
    # the first checkpoint (after the first cell) is announced once, with its limit, at the next cell
    assert len([n for n in sink.notices if "is checkpointed after each cell that changes it" in n]) == 1
    outcome, sink, _ = run_cell(kube_s3, CHECK, {}, session="train", **where)
    assert outcome.status == "ok" and not [n for n in sink.notices if "checkpointed after each cell" in n]
    assert kube_s3.close_session("train", grace=1)


def test_a_session_survives_its_donor_being_drained(kube_s3: KubernetesBackend, core: Any, namespace: str,
                                                    where: dict[str, Any]) -> None:
    before = _start(kube_s3, where)
    pod = _pod(core, namespace)
    node = pod.spec.node_name
    # kubectl drain: cordon, then evict each pod through the Eviction API (its grace period: SIGTERM, 60 s)
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        core.create_namespaced_pod_eviction(pod.metadata.name, namespace, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name}})
        wait_until(lambda: not kube_s3.sessions(), "the session seen as ended")
        _check_resumed(kube_s3, before, f"its pod {pod.metadata.name} ", where)
        assert _pod(core, namespace).spec.node_name != node
    finally:
        core.patch_node(node, {"spec": {"unschedulable": None}})
    assert kube_s3.close_session("train", grace=1)


def _sees_cordon(kube: KubernetesBackend, node: str) -> None:
    wait_until(lambda: any(vn.name == node and vn.cordoned for vn in kube.inventory().inventory().virtual_nodes),
               f"the kernel's inventory sees {node} cordoned")


def test_a_session_on_a_cordoned_node_moves_before_its_next_cell_or_says_it_cannot(
        kube_s3: KubernetesBackend, core: Any, namespace: str, where: dict[str, Any]) -> None:
    before = _start(kube_s3, where)
    pod = _pod(core, namespace)
    node, cluster = pod.spec.node_name, node_cluster(pod.spec.node_name)
    cordoned = [node]
    core.patch_node(node, {"spec": {"unschedulable": True}})  # the drain's first step (kubectl cordon, Liqo's cordon)
    try:
        _sees_cordon(kube_s3, node)
        outcome, sink, _ = run_cell(kube_s3, CHECK, {}, session="train", **where)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert sink.text == before, (sink.text, sink.notices)  # the cell ran in the moved session, with its state
        [note] = [n for n in sink.notices if "is being drained" in n]
        assert (f"session train: donor {cluster} is being drained (its node {node} is cordoned); moved this session "
                f"from {cluster} to ") in note, note
        assert "before this cell (waited " in note and "the restore took " in note, note
        assert "restored from checkpoint train: " in note and "not restored: guard (_thread.lock" in note, note
        moved = _pod(core, namespace)
        assert moved.spec.node_name != node and moved.metadata.name != pod.metadata.name

        # the other donor drained too: nowhere else fits, so the cell runs where the session is and says so
        cordoned.append(moved.spec.node_name)
        core.patch_node(moved.spec.node_name, {"spec": {"unschedulable": True}})
        _sees_cordon(kube_s3, moved.spec.node_name)
        outcome, sink, _ = run_cell(kube_s3, CHECK, {}, session="train", **where)
        assert outcome.status == "ok" and sink.text == before, (outcome.error, sink.notices)
        [note] = [n for n in sink.notices if "is being drained" in n]
        assert f"its node {moved.spec.node_name} is cordoned), and no other donor has room for this session" in note
        assert _pod(core, namespace).metadata.name == moved.metadata.name
    finally:
        for name in cordoned:
            core.patch_node(name, {"spec": {"unschedulable": None}})
    assert kube_s3.close_session("train", grace=1)


def test_an_idle_session_on_a_node_that_gets_cordoned_is_moved_before_any_cell(
        kube_s3: KubernetesBackend, core: Any, namespace: str, where: dict[str, Any]) -> None:
    before = _start(kube_s3, where)
    written = kube_s3.keeper.store().latest("train")
    pod = _pod(core, namespace)
    node, cluster = pod.spec.node_name, node_cluster(pod.spec.node_name)
    core.patch_node(node, {"spec": {"unschedulable": True}})  # a cordon, and no cell: only the drain watch moves it
    try:
        [line] = wait_until(lambda: [s.release for s in kube_s3.sessions() if "moved from" in s.release],
                            "the idle session moved off the cordoned node without a cell", timeout=120)
        assert (f"moved from {cluster} at " in line and f", while idle: donor {cluster} is being drained (its node "
                f"{node} is cordoned)" in line), line
        moved = _pod(core, namespace)
        assert moved.spec.node_name != node and moved.metadata.name != pod.metadata.name
        # the state had not changed since the checkpoint after the last cell: that one was restored, not a new one
        assert written is not None and kube_s3.keeper.store().latest("train").obj == written.obj  # type: ignore[union-attr]
        outcome, sink, _ = run_cell(kube_s3, CHECK, {}, session="train", **where)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert sink.text == before, (sink.text, sink.notices)  # the same values, in the moved session
        [note] = [n for n in sink.notices if "is being drained" in n]
        assert (f"session train: donor {cluster} is being drained (its node {node} is cordoned); moved this session "
                f"from {cluster} to ") in note and ", while it was idle and before this cell (waited " in note, note
        assert "restored from checkpoint train: " in note and "not restored: guard (_thread.lock" in note, note
        assert _pod(core, namespace).metadata.name == moved.metadata.name
        assert not [s.release for s in kube_s3.sessions() if s.release]  # said once
    finally:
        core.patch_node(node, {"spec": {"unschedulable": None}})
    assert kube_s3.close_session("train", grace=1)


def node_cluster(node: str) -> str:
    """The donor whose virtual node is ``node`` (``donor-1-gpu`` is donor-1's)."""
    return node.removesuffix("-gpu")


@pytest.fixture()
def kube_idle(api_client: Any, namespace: str, s3: Any, s3_endpoint: str, core: Any) -> Iterator[KubernetesBackend]:
    """A backend with object storage whose sessions are released after 3 s idle (the hub's timeout); afterwards
    no pod, Secret or object is left."""
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         session_idle_timeout=3.0), api_client)
    try:
        yield backend
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def _released(core: Any, namespace: str) -> None:
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, "the idle session's pod released", timeout=60)


def test_an_idle_session_is_released_and_resumed_by_its_next_cell(kube_idle: KubernetesBackend, namespace: str,
                                                                  core: Any, where: dict[str, Any]) -> None:
    before = _start(kube_idle, where)
    _released(core, namespace)
    assert kube_idle.keeper.returned() > 0
    status = kube_idle.describe()
    assert "its next cell resumes it from checkpoint train (" in status and "model" in status, status
    assert "GPU-hours given back by idle sessions released with a checkpoint: 0.00" in status, status
    sink = _check_resumed(kube_idle, before, "was ended after 3 s idle holding 1 GPU", where)
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert "its state was checkpointed first (train, " in note, note
    [told] = [n for n in sink.notices if "is checkpointed after each cell that changes it" in n]
    assert "Idle for 3 s (the hub's offload.sessionIdleTimeout), its pod is released" in told, told


def test_a_resumed_session_says_how_long_its_restore_should_take_from_this_kernels_own(
        kube_idle: KubernetesBackend, namespace: str, core: Any, where: dict[str, Any]) -> None:
    """Issue 27 "why am I waiting": before the wait for the new pod, the cell says what it restores and how long
    that should take, from the checkpoint this kernel timed (no restore yet), then from its own restore."""
    before = _start(kube_idle, where)
    _released(core, namespace)
    sink = _check_resumed(kube_idle, before, "was ended after 3 s idle holding 1 GPU", where)
    [told] = [n for n in sink.notices if "restoring checkpoint train (" in n]
    # the checkpoint's time holds no import of torch, which the new runner does before it unpickles the state
    assert re.search(r"; it should take (about .+|under 1 s), from this kernel's one checkpoint \(.+/s\) as it has "
                     "restored none yet: a restore moves the bytes a checkpoint wrote; not counted: the new runner's "
                     "import of numpy, torch$", told), told
    _released(core, namespace)
    # the state the first resume left (its lock was not restored) is what comes back this time
    outcome, sink, _ = run_cell(kube_idle, CHECK, {}, session="train", **where)
    assert outcome.status == "ok" and sink.text == before, (outcome.error, sink.notices)
    [told] = [n for n in sink.notices if "restoring checkpoint train (" in n]
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert sink.notices.index(told) < sink.notices.index(note), sink.notices
    assert re.search(r"; it should take (about .+|under 1 s), from this kernel's one restore \(.+/s\)$", told), told
    assert kube_idle.close_session("train", grace=1)


def test_a_cell_with_other_options_does_not_resume_a_released_session_and_loses_nothing(
        kube_idle: KubernetesBackend, namespace: str, core: Any, origin: Any, where: dict[str, Any]) -> None:
    """A session ended on its own is resumed by a cell asking for its shape; a cell asking for other GPUs would
    have started a different session silently (and a full checkpoint could be refused where it lands): it is
    refused before anything is created, the checkpoint stays, and closing the session lets it start afresh."""
    kernel_side_only(origin)
    before = _start(kube_idle, where)
    _released(core, namespace)
    with pytest.raises(OffloadUsageError, match=r"Session `train` ran with --gpus 1 and its pod .* was ended "
                       r"after 3 s idle.*gpus 1 \(this cell: 2\)\)\. Run it with the session's options to resume the session "
                       r"from its last checkpoint train \(.*`%gpu_offload close train`"):
        run_cell(kube_idle, CHECK, {}, session="train", **{**where, "gpus": 2})
    assert not core.list_namespaced_pod(namespace).items  # nothing was launched
    assert "its next cell resumes it from checkpoint train (" in kube_idle.describe()
    _check_resumed(kube_idle, before, "was ended after 3 s idle holding 1 GPU", where)  # its options: resumed
    _released(core, namespace)
    assert kube_idle.close_session("train", grace=1)  # a released session can be closed ...
    outcome, sink, _ = run_cell(kube_idle, "print('fresh', 'arr' in globals())", {}, session="train",
                                **{**where, "timeout": 300.0})  # ... and starts afresh with other options
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sink.text == "fresh False\n" and not [n for n in sink.notices if "resumed on" in n], sink.notices
    assert kube_idle.close_session("train", grace=1)


def test_a_session_asks_for_a_shorter_idle_timeout_and_status_says_when_it_goes(
        api_client: Any, namespace: str, s3: Any, s3_endpoint: str, core: Any, origin: Any,
        where: dict[str, Any]) -> None:
    kernel_side_only(origin)
    # the hub's timeout (an hour) would hold the GPU all through the test. Status is read while the session's own
    # timeout is 10 min, so no release can come before the reading however loaded the machine (with a timeout of
    # a few seconds the listing was missed at load 30); the next cell asks for 3 s and the session is released.
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint), trusted=DONORS,
                                         session_idle_timeout=3600.0), api_client)
    try:
        outcome, sink, _ = run_cell(backend, SETUP + CHECK, {}, session="train", idle_timeout=600.0, **where)
        assert outcome.status == "ok", outcome.error
        assert "session train is released after 10 min idle from now on (--idle-timeout" in " ".join(
            str(n) for n in sink.notices), sink.notices
        before = sink.text
        # the idle timer starts once the checkpoint after the cell is written; status then says when it ends
        backend.keeper.settle("train")
        [listed] = wait_until(lambda: [i.release for i in backend.sessions() if ": at " in i.release],
                              "the session's release time listed", timeout=60)
        assert listed.startswith("released after 10 min idle (--idle-timeout): at "), listed
        assert listed.endswith(" UTC, in 10 min, unless a cell comes first") or ", in 9 min, " in listed, listed
        _assert_about(listed.split(": at ")[1][:8], time.time() + 600.0)

        outcome, sink, _ = run_cell(backend, CHECK, {}, session="train", idle_timeout=3.0, **where)
        assert outcome.status == "ok" and sink.text == before, (outcome.error, sink.text, sink.notices)
        assert "session train is released after 3 s idle from now on (--idle-timeout" in " ".join(
            str(n) for n in sink.notices), sink.notices
        [told] = [n for n in sink.notices if "is checkpointed after each cell that changes it" in n]
        assert "Idle for 10 min (--idle-timeout), its pod is released" in told, told
        wait_until(lambda: not core.list_namespaced_pod(namespace).items, "the idle session's pod released",
                   timeout=60)
        sink = _check_resumed(backend, before, "was ended after 3 s idle holding 1 GPU", where)
        [note] = [n for n in sink.notices if "resumed on" in n]
        assert "(the session idle timeout, --idle-timeout); its state was checkpointed first" in note, note
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def _assert_about(clock: str, expected: float) -> None:
    """``clock`` (``HH:MM:SS``, UTC) is within a minute of the wall-clock time ``expected``."""
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    off = (hours * 3600 + minutes * 60 + seconds - expected) % 86400
    assert min(off, 86400 - off) <= 60, (clock, time.strftime("%H:%M:%S", time.gmtime(expected)))


def test_a_session_moved_to_another_cluster_keeps_its_state(kube_s3: KubernetesBackend, core: Any,
                                                             namespace: str, where: dict[str, Any]) -> None:
    before = _start(kube_s3, where)
    first = _pod(core, namespace)
    here = first.spec.node_name
    [there] = [d for d in DONORS if d not in here]
    lines = kube_s3.move_session("train", cluster=there, grace=1)
    assert lines[0].startswith("checkpoint train (session train, written on ") and "model" in lines[0], lines
    assert f"session train: resumed on {there}" in lines[1] and "restored from checkpoint train: " in lines[1], lines
    moved = _pod(core, namespace)
    assert moved.metadata.name != first.metadata.name and there in moved.spec.node_name
    # a cell that asks for the session's first placement still runs in the moved session
    outcome, sink, _ = run_cell(kube_s3, CHECK, {}, session="train", **where)
    assert outcome.status == "ok" and sink.text == before, (outcome.error, sink.text, sink.notices)
    assert kube_s3.close_session("train", grace=1)


def test_an_untrusted_donors_checkpoint_comes_back_as_data_only(api_client: Any, namespace: str, s3: Any,
                                                                s3_endpoint: str, core: Any,
                                                                where: dict[str, Any]) -> None:
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client)
    try:
        outcome, _, _ = run_cell(backend, SETUP + "state = model.state_dict()\n", {}, session="train", **where)
        assert outcome.status == "ok", outcome.error
        backend.keeper.settle("train")
        saved = backend.keeper.store().latest("train")
        assert saved is not None and not saved.trusted and saved.manifest["format"] == "safe"
        core.delete_namespaced_pod(_pod(core, namespace).metadata.name, namespace, grace_period_seconds=0)
        wait_until(lambda: not backend.sessions(), "the session seen as ended")
        outcome, sink, _ = run_cell(backend, "print(n, arr.sum(), sorted(state))", {}, session="train", **where)
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert sink.text == "41 15.0 ['bias', 'weight']\n", sink.text
        [note] = [n for n in sink.notices if "resumed on" in n]
        for name in ("model", "opt", "double"):
            assert f"{name} (" in note.split("not restored:")[1], note
        assert "torch (module torch: import it again" in note, note
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def test_a_cell_running_when_its_pod_is_stopped_leaves_its_state_written_at_sigterm(
        kube_s3: KubernetesBackend, core: Any, namespace: str, where: dict[str, Any]) -> None:
    _start(kube_s3, where)
    cell = "n = 99\nprint('changing', flush=True)\nimport time\ntime.sleep(600)\n"
    thread, result, sink = cell_in_thread(kube_s3, cell, "train", **where)
    pod = _pod(core, namespace)
    assert pod.spec.termination_grace_period_seconds == 60  # time for the runner to write its state
    # evicted as a drain evicts it: the API server deletes it with its grace period, the runner gets SIGTERM
    core.create_namespaced_pod_eviction(pod.metadata.name, namespace, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name}})
    thread.join(120)
    assert result["run"][0].status != "ok"
    # the running cell was told at once, before it was interrupted, in the kernel's words
    [told] = [n for n in sink.notices if "is being stopped" in n]
    assert told.startswith("warning: this session's pod is being stopped (SIGTERM: Kubernetes is deleting it, as a "
                           "preemption, a drain or an eviction does); checkpointing now"), told
    wait_until(lambda: not kube_s3.sessions(), "the session seen as ended")
    outcome, sink, _ = run_cell(kube_s3, "print(n, double(2), len(opt.state))", {}, session="train", **where)
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert sink.text == "99 4 2\n", (sink.text, sink.notices)  # the interrupted cell's change came back too
    [note] = [n for n in sink.notices if "resumed on" in n]
    assert "its runner wrote a checkpoint as the pod was stopped (SIGTERM)" in note, note
    assert kube_s3.close_session("train", grace=1)


def test_a_sigterm_checkpoint_record_forged_in_storage_is_not_used(kube_s3: KubernetesBackend, core: Any,
                                                                    namespace: str, s3: Any, origin: Any,
                                                                    where: dict[str, Any]) -> None:
    kernel_side_only(origin)
    before = _start(kube_s3, where)
    armed = kube_s3.keeper._armed["train"]
    # another writer of the bucket puts its own state and record where the runner would write at SIGTERM
    store = kube_s3.keeper.store()
    forged = {"format": "pickle", "size": 3, "sha256": "0" * 64, "saved": ["n"], "hmac": "1" * 64}
    s3.put_object(Bucket=BUCKET, Key=store.storage.key(store.folder, armed.obj), Body=b"bad")
    s3.put_object(Bucket=BUCKET, Key=store.storage.key(store.folder, armed.obj + ".m"),
                  Body=__import__("json").dumps(forged).encode())
    core.delete_namespaced_pod(_pod(core, namespace).metadata.name, namespace, grace_period_seconds=0)
    wait_until(lambda: not kube_s3.sessions(), "the session seen as ended")
    sink = _check_resumed(kube_s3, before, "ended", where)
    assert not any("SIGTERM" in n for n in sink.notices), sink.notices
    assert kube_s3.close_session("train", grace=1)
