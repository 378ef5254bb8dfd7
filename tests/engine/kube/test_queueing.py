"""Cells that wait in Kueue's queue, through the real engine, against the sandbox's Liqo origin with Kueue and
against the real cluster with real Kueue (tests/realcluster: two real nodes, Liqo's objects seeded).

Two donors of one GPU each; the pool (flavors, ClusterQueue, priority classes, a LocalQueue per user) is
made by ``gpu-offload queues sync`` as an admin would. The pool is pre-filled by two "filler" pods that also
queue through Kueue, so every cell of a test waits until the test deletes a filler. Kueue is configured
with a usage sampling interval longer than the run, so Admission Fair Sharing's entry penalties decide
the order (no sample falls inside a test; real Kueue samples every minute, which only adds to the usage of the
queue that holds the pool). Tests that inject API faults are the sandbox's alone.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import kubernetes
import pytest
import urllib3
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.analysis import analyse_cell
from gpu_offload.engine.backends.base import RunRequest
from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.sweep import OrphanSweep
from gpu_offload.engine.bundle import build_job
from gpu_offload.engine.engine import FollowSettings
from gpu_offload.engine.errors import OffloadError, OffloadQueueTimeout, OffloadUsageError

from ...origins import QUEUED_ONE_EACH
from .chart_roles import rendered_chart, user_server_client
from .conftest import (
    STOCK_IMAGE,
    kueue_origin_on_each_cluster,
    leftovers,
    queued_user_namespace,
    sandbox_faults,
    settings,
)
from .helpers import Sink, run_cell

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "gpu-offload"
DONORS = QUEUED_ONE_EACH.donors
USERS = ("alice@example.org", "bob@example.org", "carol@example.org")


SANDBOX_KUEUE = QUEUED_ONE_EACH.pool_options()
"""The sandbox's origin with Kueue of this module and test_kueue_contract.py: one shared origin for both."""
origin = kueue_origin_on_each_cluster(QUEUED_ONE_EACH)


@pytest.fixture()
def namespaces(origin: Any, core: Any, custom: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("KUBECONFIG", str(origin.sandbox.kubeconfig))
    monkeypatch.delenv("GPU_OFFLOAD_CONFIG", raising=False)
    return [queued_user_namespace(core, custom) for _ in USERS]


@pytest.fixture()
def kernels(api_client: Any, namespaces: list[str], core: Any, custom: Any) -> Iterator[list[KubernetesBackend]]:
    """One kernel per user, each in its own namespace and LocalQueue; afterwards nothing of theirs is left."""
    backends = [KubernetesBackend(settings(ns, user=user, queue=QUEUE, priority="interactive"), api_client)
                for ns, user in zip(namespaces, USERS, strict=True)]
    yield backends
    for backend in backends:
        backend.close()
    for ns, user in zip(namespaces, USERS, strict=True):
        for pod in core.list_namespaced_pod(ns).items:  # fillers
            with contextlib.suppress(kubernetes.client.ApiException):
                core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        wait_until(lambda ns=ns: not core.list_namespaced_pod(ns).items, "no pod left", timeout=60)
        assert leftovers(core, ns, user) == []
        wait_until(lambda ns=ns: not workloads(custom, ns), "no Workload left", timeout=60)
        core.delete_namespace(ns)


def workloads(custom: Any, namespace: str) -> list[dict[str, Any]]:
    return list(custom.list_namespaced_custom_object(*KUEUE, namespace, "workloads")["items"])


def fill(core: Any, namespace: str, name: str) -> str:
    """A one-GPU pod that queues through Kueue and sleeps until deleted; returns the donor Kueue gave it."""
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        # as high a priority as the cells: Kueue would preempt a lower one for them
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                                              "kueue.x-k8s.io/priority-class": "interactive"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": STOCK_IMAGE, "command": ["python3", "-c", "import time; time.sleep(600)"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    pod = wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
                     f"filler {name} running")
    return str(pod.spec.node_selector["liqo.io/remote-cluster-id"])


def fill_pool(core: Any, namespace: str) -> dict[str, str]:
    """Both GPUs held by fillers of ``namespace``'s LocalQueue; returns donor -> filler name."""
    return {fill(core, namespace, name): name for name in ("fill-1", "fill-2")}


def admissions(custom: Any, seen: list[str]) -> None:
    """Record, in a daemon thread, the namespace of every Workload as Kueue admits it, in the order the API
    server saw it (one watch: Workloads already admitted come first)."""
    def record() -> None:
        admitted: set[str] = set()
        watch = kubernetes.watch.Watch()
        with contextlib.suppress(urllib3.exceptions.HTTPError):  # the stream ends when the sandbox stops
            for event in watch.stream(custom.list_cluster_custom_object, *KUEUE, "workloads", timeout_seconds=600):
                obj = event["object"]
                conds = (obj.get("status") or {}).get("conditions") or []
                if obj["metadata"]["uid"] not in admitted and any(
                        c["type"] == "Admitted" and c["status"] == "True" for c in conds):
                    admitted.add(obj["metadata"]["uid"])
                    seen.append(obj["metadata"]["namespace"])

    threading.Thread(target=record, daemon=True).start()


def pending_in(custom: Any, namespace: str) -> bool:
    return any(not any(c["type"] == "Admitted" and c["status"] == "True"
                       for c in (w.get("status") or {}).get("conditions") or [])
               for w in workloads(custom, namespace))


def in_thread(backend: KubernetesBackend, cell: str, sink: Sink, results: dict[str, Any], key: str,
              **kwargs: Any) -> threading.Thread:
    def run() -> None:
        try:
            results[key] = run_cell(backend, cell, {}, sink, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            results[key] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def shows_place(sink: Sink) -> bool:
    return any(n.startswith("queued for 1 GPU: ") and " in line; waiting " in n for n in sink.notices)


def test_cells_of_three_users_wait_show_their_place_and_run_in_fair_share_order(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    alice, bob, carol = namespaces
    fill_pool(core, alice)  # alice's pods hold the pool: her LocalQueue has used it
    seen: list[str] = []
    admissions(custom, seen)
    wait_until(lambda: len(seen) == 2, "the fillers' admissions recorded")
    results: dict[str, Any] = {}
    sinks = [Sink() for _ in namespaces]
    threads = []
    for index, ns in enumerate(namespaces):  # one after the other, so Kueue queues them in this order
        threads.append(in_thread(kernels[index], f"print('cell of user {index}')", sinks[index], results, ns))
        wait_until(lambda ns=ns: pending_in(custom, ns), f"the cell of {ns} pending in Kueue")
        # Kueue orders by the Workload's creationTimestamp, which has whole seconds, and breaks a tie by UID (real
        # Kueue 0.19 did put carol's cell before bob's when both came in one second): the next one a second later
        time.sleep(1.0)
    for sink in sinks:  # every waiting cell says where it stands, before anything frees
        wait_until(lambda sink=sink: shows_place(sink), "a waiting cell showing its place", timeout=90)
    core.delete_namespaced_pod("fill-1", alice, grace_period_seconds=0)  # one GPU frees
    for thread in threads:
        thread.join(300)
    for index, ns in enumerate(namespaces):
        outcome, sink, _ = results[ns]
        assert outcome.status == "ok", (ns, outcome.error, sink.notices)
        assert f"cell of user {index}" in sink.text
        assert any(n.startswith("admitted by Kueue after ") for n in sink.notices), sink.notices
    # Admission Fair Sharing: alice's LocalQueue has used the pool, so bob's and carol's cells are admitted
    # before hers although hers was queued first; bob's before carol's by queue time
    assert seen == [alice, alice, bob, carol, alice], seen


def test_a_queued_pod_asks_only_for_its_gpus_and_kueue_sends_it_to_a_donor(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any) -> None:
    alice, bob, _ = namespaces
    where = fill_pool(core, bob)
    results: dict[str, Any] = {}
    thread = in_thread(kernels[0], "print('ran')", Sink(), results, "cell", priority="interactive")
    selector = "gpu-offload.io/managed-by=gpu-offload"
    pod = wait_until(lambda: next(iter(core.list_namespaced_pod(alice, label_selector=selector).items), None),
                     "the cell's pod")
    assert pod.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
    assert pod.metadata.labels["kueue.x-k8s.io/priority-class"] == "interactive"
    # no node choice of the kernel's: nothing names a donor (Liqo's webhook adds only its offloading strategy's
    # virtual-node term and toleration), no node selector; Kueue's gate holds it
    # (the real cluster runs no Liqo webhook yet, issue 26: no affinity at all there)
    affinity = pod.spec.affinity
    terms = affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms if affinity else []
    assert not any(e.key == "liqo.io/remote-cluster-id" for t in terms for e in t.match_expressions or [])
    assert not pod.spec.node_selector
    # real Kueue 0.19 adds its topology gate beside the admission gate; the sandbox only the latter (a gap in
    # docs/realcluster.md)
    gates = [g.name for g in pod.spec.scheduling_gates]
    assert gates[0] == "kueue.x-k8s.io/admission" and set(gates[1:]) <= {"kueue.x-k8s.io/topology"}, gates
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    core.delete_namespaced_pod(where["donor-2"], bob, grace_period_seconds=0)
    thread.join(120)
    outcome, sink, run = results["cell"]
    assert outcome.status == "ok" and "ran" in sink.text, (outcome.error, sink.notices)
    # the flavor's node labels and Liqo's toleration came from Kueue at admission
    assert run.cluster == "donor-2" and any("Liqo cluster donor-2, 1 x L4" in n for n in sink.notices), sink.notices
    assert not any("retrying" in n for n in sink.notices)


def test_ctrl_c_of_a_queued_cell_withdraws_it_and_leaves_no_pod_or_workload(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    alice, bob, _ = namespaces
    fill_pool(core, bob)

    class CtrlC(Sink):
        pressed = False

        def notice(self, text: str) -> None:
            super().notice(text)
            if text.startswith("queued for") and not self.pressed:
                self.pressed = True
                raise KeyboardInterrupt  # where the engine is when the user presses Ctrl-C

    sink = CtrlC()
    with pytest.raises(KeyboardInterrupt):
        run_cell(kernels[0], "print('never')", {}, sink)
    assert any(n.startswith("withdrawn from the queue (LocalQueue gpu-offload) after ") and n.endswith(
        "nothing ran") for n in sink.notices), sink.notices
    assert "never" not in sink.text
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the queued pod and its Secret gone")
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone")


QUEUE_TIMEOUT = 10.0
"""Long enough for the place in line (read from Kueue's visibility API once the pod exists) to arrive on a
loaded machine before the kernel gives up: the message names what it last saw."""


def test_queue_timeout_gives_up_with_a_message_and_leaves_nothing(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    alice, bob, _ = namespaces
    fill_pool(core, bob)
    outcome, sink, _ = run_cell(kernels[0], "print('never')", {},
                                follow_settings=FollowSettings(progress_after=1.0, grace=10.0, queue_timeout=QUEUE_TIMEOUT))
    assert isinstance(outcome.error, OffloadQueueTimeout), (outcome.error, sink.notices)
    message = str(outcome.error)
    assert message.startswith(f"Gave up after waiting --queue-timeout {QUEUE_TIMEOUT:.0f} s in the queue (last seen: "
                              "queued for 1 GPU")
    assert "nothing ran" in message and "never" not in sink.text
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the queued pod and its Secret gone")
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone")


def test_without_gpu_offload_queue_the_kernel_waits_in_the_one_localqueue_of_its_namespace(
        api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_OFFLOAD_QUEUE", raising=False)
    alice, bob, _ = namespaces
    fill_pool(core, bob)
    found = KubernetesBackend(settings(alice, user=USERS[0]), api_client)  # no queue named
    try:
        outcome, sink, _ = run_cell(found, "print('never')", {},
                                    follow_settings=FollowSettings(progress_after=1.0, grace=10.0, queue_timeout=QUEUE_TIMEOUT))
    finally:
        found.close()
    # it queued (a cell without queueing would have failed placement on the full pool, not timed out in line)
    assert isinstance(outcome.error, OffloadQueueTimeout), (outcome.error, sink.notices)
    assert str(outcome.error).startswith(f"Gave up after waiting --queue-timeout {QUEUE_TIMEOUT:.0f} s in the queue "
                                         "(last seen: queued for 1 GPU")
    assert any(n.startswith("queued for 1 GPU") for n in sink.notices), sink.notices
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the queued pod and its Secret gone")
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone")


def test_without_gpu_offload_queue_several_localqueues_are_named_and_nothing_is_launched(
        api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_OFFLOAD_QUEUE", raising=False)
    alice = namespaces[0]
    custom.create_namespaced_custom_object(*KUEUE, alice, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "another"},
        "spec": {"clusterQueue": QUEUE}})
    found = KubernetesBackend(settings(alice, user=USERS[0]), api_client)
    try:
        with pytest.raises(OffloadUsageError) as caught:
            run_cell(found, "print('never')", {})
        assert str(caught.value) == (
            f"Nothing was launched: GPU_OFFLOAD_QUEUE is not set and namespace {alice} has 2 Kueue LocalQueues "
            "(another, gpu-offload), so this kernel cannot tell which one its cells should wait in. Set it to one of "
            "them, e.g. `%env GPU_OFFLOAD_QUEUE=another`, and run the cell again.")
        assert not core.list_namespaced_pod(alice).items and not workloads(custom, alice)
        # the fix the message gives works in the same kernel
        monkeypatch.setenv("GPU_OFFLOAD_QUEUE", QUEUE)
        outcome, sink, _ = run_cell(found, "print('ran')", {})
        assert outcome.status == "ok" and "ran" in sink.text, (outcome.error, sink.notices)
        assert found.launcher.queue_name() == QUEUE
    finally:
        found.close()


def test_a_kernel_that_may_not_list_localqueues_runs_without_queueing_as_before(
        origin: Any, api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any,
        custom: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a chart with queueing off grants no list on LocalQueues: the kernel's cells go through placement
    monkeypatch.delenv("GPU_OFFLOAD_QUEUE", raising=False)
    alice = namespaces[0]
    refused = sandbox_faults(origin).api_error(rf"/namespaces/{alice}/localqueues$", status=403, methods=("GET",))
    found = KubernetesBackend(settings(alice, user=USERS[0]), api_client)
    try:
        outcome, sink, run = run_cell(found, "print('placed')", {})
        assert sandbox_faults(origin).api.faults.fired(refused) == 1  # asked once, not per cell
        outcome2, _, _ = run_cell(found, "print('again')", {})
        assert sandbox_faults(origin).api.faults.fired(refused) == 1
    finally:
        found.close()
        sandbox_faults(origin).clear()
    assert outcome.status == "ok" and "placed" in sink.text, (outcome.error, sink.notices)
    assert outcome2.status == "ok"
    assert found.launcher.queue_name() is None
    assert not any(n.startswith(("queued", "admitted by Kueue")) for n in sink.notices), sink.notices
    assert not workloads(custom, alice)  # no pod of the kernel's went through Kueue


def test_a_cell_larger_than_every_flavor_fails_at_once_saying_why(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    with pytest.raises(OffloadUsageError) as caught:
        run_cell(kernels[0], "print('never')", {}, gpus=2)
    message = str(caught.value)
    assert message.startswith("Nothing was launched: this cell asks for 2 GPUs and no flavor of ClusterQueue "
                              "gpu-offload holds that many"), message
    assert "--gpus 1 or fewer" in message
    assert not core.list_namespaced_pod(namespaces[0]).items and not workloads(custom, namespaces[0])


def test_a_pinned_cell_waits_for_its_cluster_while_another_frees(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    alice, bob, carol = namespaces
    where = fill_pool(core, carol)
    results: dict[str, Any] = {}
    pinned_sink = Sink()
    pinned = in_thread(kernels[0], "print('on donor-1')", pinned_sink, results, "pinned", cluster="donor-1")
    wait_until(lambda: pending_in(custom, alice), "the pinned cell pending")
    core.delete_namespaced_pod(where["donor-2"], carol, grace_period_seconds=0)
    # donor-2 is free and the pinned cell was queued first, yet a later unpinned cell takes donor-2: Kueue
    # gives a pod only a flavor its node affinity matches
    outcome, sink, run = run_cell(kernels[1], "print('anywhere')", {})
    assert outcome.status == "ok" and run.cluster == "donor-2", (outcome.error, sink.notices)
    assert pinned.is_alive() and pending_in(custom, alice)
    core.delete_namespaced_pod(where["donor-1"], carol, grace_period_seconds=0)
    pinned.join(120)
    outcome, sink, run = results["pinned"]
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert run.cluster == "donor-1" and "on donor-1" in sink.text
    assert any("Liqo cluster donor-1" in n for n in sink.notices), sink.notices


def test_a_queued_cell_brings_back_any_value_when_every_donor_kueue_may_pick_is_trusted(
        api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str]) -> None:
    """The pod is made before Kueue picks its donor: when every donor the inventory lists is trusted, the runner
    sends pickles and the kernel takes them from the donor Kueue picked (with a donor untrusted, the same value is
    refused: ``test_untrusted.py``)."""
    trusting_all = KubernetesBackend(settings(namespaces[0], queue=QUEUE, priority="interactive",
                                              trusted=tuple(d.cluster_id for d in DONORS)), api_client)
    try:
        user_ns: dict[str, Any] = {}
        outcome, sink, run = run_cell(trusting_all, "from fractions import Fraction\nthird = Fraction(1, 3)",
                                      user_ns)
    finally:
        trusting_all.close()
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert run.cluster in {d.cluster_id for d in DONORS}
    assert user_ns["third"] == Fraction(1, 3), sink.notices
    assert not any("cannot come back" in n for n in sink.notices), sink.notices


def test_the_orphan_sweep_removes_the_queued_pod_of_a_dead_kernel(
        api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any) -> None:
    alice, bob, _ = namespaces
    fill_pool(core, bob)
    dead = KubernetesBackend(settings(alice, user=USERS[0], queue=QUEUE, server="srv-1", kernel="k-dead"),
                             api_client)
    try:
        job, _ = build_job("print('never')", analyse_cell("print('never')", {}), {}, dead.transfer,
                           request=RunRequest(gpus=1))
        run = dead.submit(job)
        wait_until(lambda: pending_in(custom, alice), "the dead kernel's cell pending")
        sweep = OrphanSweep(dead.pods, USERS[0], "srv-1", live_kernels=dict)
        removed = sweep.sweep()
        assert removed and all(name.startswith("gpuo-") for name in removed), removed
        wait_until(lambda: not workloads(custom, alice), "the swept pod's Workload gone")
        run.release(0)
    finally:
        dead.close()
    assert leftovers(core, alice, USERS[0]) == []


def test_a_noblock_handle_and_the_panel_show_the_place_in_line(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any, tmp_path: Any) -> None:
    from gpu_offload.engine.execution import Launch, OffloadHandle
    from gpu_offload.engine.observing import RunEvents
    from gpu_offload.engine.request import OffloadRequest
    from gpu_offload.engine.runs.records import RunBook
    from gpu_offload.engine.runs.tracking import Tracker

    _, bob, _ = namespaces
    where = fill_pool(core, bob)
    panel = Tracker(RunBook(tmp_path / "runs"), kernel="k-panel")
    events = RunEvents()
    events.subscribe(panel)  # as the magic subscribes the kernel's run book
    cell = "print('later')"
    handle = OffloadHandle(OffloadRequest(cell, noblock=True), Launch(analyse_cell(cell, {})), {}, kernels[0],
                           FollowSettings(progress_after=1.0, grace=5.0), Sink(), events)
    try:
        progress = wait_until(lambda: "1st of 1 in line" in handle.progress and handle.progress,
                              "the handle showing the place in line", timeout=90)
        assert progress.startswith("queued for 1 GPU: 1st of 1 in line; waiting "), progress
        assert repr(handle).startswith("<gpu_offload run running (queued for 1 GPU: ")
        # the record reads "queued" from the moment it is submitted; the place in line follows with Kueue's answer
        [record] = wait_until(lambda: [r for r in panel.records() if r.state == "queued" and r.detail],
                              "the panel's queued run with its place in line")
        assert record.detail.startswith("queued for 1 GPU: ") and " in line; waiting " in record.detail
        core.delete_namespaced_pod(where["donor-1"], bob, grace_period_seconds=0)
        assert handle.wait(120)
        assert handle.result() == {} and handle.status == "ok"
        [record] = panel.records()
        assert (record.state, record.cluster) == ("done", "donor-1")  # the donor Kueue chose
    finally:
        handle.cancel()
        handle.wait(30)


def test_a_session_pod_waits_in_line_and_then_keeps_its_state(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any) -> None:
    _, bob, _ = namespaces
    fill_pool(core, bob)
    results: dict[str, Any] = {}
    sink = Sink()
    thread = in_thread(kernels[0], "x = 41\nprint('first')", sink, results, "first", session="warm")
    wait_until(lambda: shows_place(sink), "the session's first cell showing its place", timeout=90)
    core.delete_namespaced_pod("fill-1", bob, grace_period_seconds=0)
    thread.join(120)
    outcome, sink, _ = results["first"]
    assert outcome.status == "ok" and "first" in sink.text, (outcome.error, sink.notices)
    assert any(n.startswith("admitted by Kueue after ") for n in sink.notices), sink.notices
    outcome, sink, _ = run_cell(kernels[0], "print(x + 1)", {}, session="warm")  # x lives in the session
    assert outcome.status == "ok" and "42" in sink.text, (outcome.error, sink.notices)
    assert not any(n.startswith("queued") for n in sink.notices)  # the warm pod is admitted already


def test_with_queueing_on_the_kernel_never_moves_a_pod_itself(
        kernels: list[KubernetesBackend], namespaces: list[str], core: Any) -> None:
    # where a pod goes is Kueue's choice: the retry elsewhere that the kernel does without queueing is refused
    # before anything is created (a pod Kueue evicts for not starting is queued again, test_pure)
    from gpu_offload.engine.backends.kube.plan import PodOrder

    order = PodOrder("r-moved", "0" * 32, RunRequest(gpus=1), b"")
    with pytest.raises(OffloadUsageError, match="Kueue picks the donor, and a pod it evicts for not starting is queued again once"):
        kernels[0].launcher.launch(order, frozenset({"donor-1"}))
    assert not core.list_namespaced_pod(namespaces[0]).items


def test_a_kernel_that_may_not_read_the_cluster_queue_still_shows_the_place_in_line(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any) -> None:
    # an admin who dropped the chart's queue-viewer binding: no watch, the visibility API is read on a timer
    _, bob, _ = namespaces
    where = fill_pool(core, bob)
    refused = sandbox_faults(origin).api_error(r"/clusterqueues$", status=403, methods=("GET",))
    try:
        results: dict[str, Any] = {}
        sink = Sink()
        thread = in_thread(kernels[0], "print('ran')", sink, results, "cell")
        wait_until(lambda: shows_place(sink), "the cell showing its place without the watch", timeout=90)
        assert sandbox_faults(origin).api.faults.fired(refused) >= 1  # the kernel did ask, and was refused
        core.delete_namespaced_pod(where["donor-1"], bob, grace_period_seconds=0)
        thread.join(120)
    finally:
        sandbox_faults(origin).clear()
    outcome, sink, _ = results["cell"]
    assert outcome.status == "ok" and "ran" in sink.text, (outcome.error, sink.notices)


def test_a_waiting_cell_shows_kueues_own_reason_read_with_the_charts_user_rights(
        origin: Any, api_client: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any,
        tmp_path: Any) -> None:
    """Kueue's words for the wait (its Workload's QuotaReserved condition) under the place in line. On the real
    cluster the kernel holds only the chart's user-server role, bound in its namespace: it may read its own
    namespace's Workloads and the API server refuses another user's; the sandbox authorizes nothing."""
    alice, bob, _ = namespaces
    where = fill_pool(core, bob)
    real = not hasattr(origin, "faults")
    objects = rendered_chart(tmp_path, {"queueing": {"kueue": {"enabled": True, "localQueue": QUEUE}}})
    with (user_server_client(api_client, bob, objects) if real else contextlib.nullcontext(api_client)) as client:
        if real:
            with pytest.raises(kubernetes.client.ApiException) as refused:
                kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(*KUEUE, alice, "workloads")
            assert refused.value.status == 403
        backend = KubernetesBackend(settings(bob, user=USERS[1], queue=QUEUE, priority="interactive"), client)
        try:
            results: dict[str, Any] = {}
            sink = Sink()
            thread = in_thread(backend, "print('ran')", sink, results, "cell")
            notice = wait_until(lambda: next((n for n in sink.notices if "\n  Kueue: " in n), None),
                                "the waiting cell showing Kueue's reason", timeout=90)
            lines = notice.splitlines()
            # "1st of 1" once the ClusterQueue's status counts it, "1st" before
            assert re.match(r"queued for 1 GPU: 1st (of 1 )?in line; waiting ", lines[0]), notice
            assert lines[1].startswith("  Kueue: couldn't assign flavors to pod set main: insufficient unused quota "
                                       "for nvidia.com/gpu in flavor "), notice
            # the reason Kueue gave decides the words: quota in use, so it waits for runs ahead to be admitted
            assert lines[2].startswith("  every GPU the queue may use is taken"), notice
            core.delete_namespaced_pod(where["donor-1"], bob, grace_period_seconds=0)
            thread.join(120)
        finally:
            backend.close()
    outcome, sink, _ = results["cell"]
    assert outcome.status == "ok" and "ran" in sink.text, (outcome.error, sink.notices)


def test_a_priority_class_the_chart_keeps_for_others_is_refused_in_the_policys_words(
        api_client: Any, core: Any, origin: Any, namespaces: list[str]) -> None:
    # The sandbox runs no ValidatingAdmissionPolicy: the API server's answer for the chart's
    # gpu-offload-priority-classes policy (tests/helm/test_admission_policy.py evaluates that policy) stands in
    namespace = namespaces[0]  # a user namespace with its LocalQueue: the queued launch reads it first
    said = ("priority class urgent is not one this user may use (the gpu-offload chart's "
            "queueing.kueue.priorityClasses: its users and groups); leave --priority out for the default class, or "
            "ask your JupyterHub admin")
    sandbox_faults(origin).api_error(rf"^/api/v1/namespaces/{namespace}/pods$", status=403, methods=("POST",), message=(
        'pods "gpuo-x" is forbidden: ValidatingAdmissionPolicy \'gpu-offload-priority-classes\' with binding '
        f"'gpu-offload-priority-classes' denied request: {said}"))
    backend = KubernetesBackend(settings(namespace, queue=QUEUE, priority="interactive"), api_client)
    try:
        with pytest.raises(OffloadError) as err:
            run_cell(backend, "print('never')", {}, priority="urgent")
    finally:
        backend.close()
        sandbox_faults(origin).clear()
    assert str(err.value) == (f"Nothing was launched: the cluster's admission policy gpu-offload-priority-classes "
                              f"refused the pod: {said}.")
    assert "RBAC" not in str(err.value)
    wait_until(lambda: not leftovers(core, namespace), "nothing left behind")


def test_the_panel_keeps_a_queued_run_queued_whatever_order_the_pods_status_and_its_place_arrive_in() -> None:
    # the follower's "waiting for Kueue" status and the place in line come from two threads: whichever is
    # last, the panel says the run is queued and where, until Kueue admits it
    from gpu_offload.engine.backends.base import Queued
    from gpu_offload.engine.runs.records import RunEntry
    from gpu_offload.engine.runs.tracking import observe
    from gpu_offload.runner.frames import Status

    record = RunEntry(run_id="r", kernel="k", pid=1, backend="kubernetes", cluster="auto", gpus=1,
                      state="scheduling", detail="waiting for a free runner", session=None, started=0.0)
    place = Queued("queued for 1 GPU: 2nd of 3 in line; waiting 4 s")
    gated = Status(-1, "waiting for Kueue to admit the pod")
    for events in ((gated, place), (place, gated)):
        seen = record
        for event in events:
            seen = observe(seen, event)
        assert (seen.state, seen.detail) == ("queued", place.text), events
    admitted = observe(observe(record, place), Queued("admitted by Kueue after 9 s in line", waiting=False))
    assert admitted.state == "scheduling"
    assert observe(admitted, gated).detail == gated.state  # once admitted, the pod's status is news again


def _shell(origin: Any, tmp_path: Any, namespace: str) -> dict[str, str]:
    """The environment of a user's shell aimed at ``namespace``, without GPU_OFFLOAD_QUEUE."""
    from ...cli.helpers import environment

    env = environment(tmp_path / "state", KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_NAMESPACE=namespace,
                      GPU_OFFLOAD_IMAGE=STOCK_IMAGE, JUPYTERHUB_USER=USERS[0])
    env.pop("GPU_OFFLOAD_QUEUE", None)
    return env


def test_gpu_offload_run_gives_up_after_its_queue_timeout_with_the_message_and_leaves_nothing(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    from ...cli.helpers import cli, write_project

    alice, bob, _ = namespaces
    fill_pool(core, bob)
    project = write_project(tmp_path / "proj")
    # a shell without GPU_OFFLOAD_QUEUE: the command finds the namespace's one LocalQueue as a kernel does
    env = _shell(origin, tmp_path, alice)
    done = cli(["run", "--queue-timeout", f"{QUEUE_TIMEOUT:.0f}", "main.py"], project.parent, env)
    assert done.returncode == 124, done.stderr
    assert (f"Gave up after waiting --queue-timeout {QUEUE_TIMEOUT:.0f} s in the queue (last seen: queued for 1 GPU"
            in done.stderr), done.stderr
    assert "hello from helper" not in done.stdout
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the queued pod and its Secret gone")
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone")
    refused = cli(["run", "--queue-timeout", "0", "main.py"], project.parent, env)
    assert refused.returncode == 2 and "--queue-timeout 0: give a positive number of seconds" in refused.stderr
    assert not core.list_namespaced_pod(alice).items


def test_gpu_offload_run_takes_a_priority_and_says_the_shells_fix_for_several_localqueues(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    import subprocess

    from ...cli.helpers import argv, cli, write_project

    alice, bob, _ = namespaces
    custom.create_namespaced_custom_object(*KUEUE, alice, "localqueues", {
        "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "another"},
        "spec": {"clusterQueue": QUEUE}})
    project = write_project(tmp_path / "proj")
    env = _shell(origin, tmp_path, alice)
    several = cli(["run", "--priority", "batch", "main.py"], project.parent, env)
    assert several.returncode == 2, several.stderr
    assert several.stderr.strip() == (
        f"gpu-offload run: Nothing was launched: GPU_OFFLOAD_QUEUE is not set and namespace {alice} has 2 Kueue "
        "LocalQueues (another, gpu-offload), so `gpu-offload run` cannot tell which one the script should wait in. "
        "Set it to one of them, e.g. `export GPU_OFFLOAD_QUEUE=another` in this shell, and run the command again.")
    refused = cli(["run", "--priority", "Batch!", "main.py"], project.parent, {**env, "GPU_OFFLOAD_QUEUE": QUEUE})
    assert refused.returncode == 2 and "--priority 'Batch!': a priority class is a lowercase name" in refused.stderr
    assert not core.list_namespaced_pod(alice).items and not workloads(custom, alice)

    # the fix works, and the run waits in Kueue with the class it asked for (below the fillers: no preemption),
    # then runs once a filler ends
    fillers = fill_pool(core, bob)
    proc = subprocess.Popen(argv("run", "--priority", "batch", "main.py"), cwd=project.parent,
                            env={**env, "GPU_OFFLOAD_QUEUE": QUEUE}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        while "queued for 1 GPU" not in (line := proc.stderr.readline()):  # the command follows the queued run
            assert line, "the command ended before its run was queued"
        (queued,) = workloads(custom, alice)
        assert queued["spec"]["priorityClassRef"]["name"] == "batch" and queued["spec"]["priority"] == 100, queued
        (pod,) = core.list_namespaced_pod(alice).items
        assert pod.metadata.labels["kueue.x-k8s.io/priority-class"] == "batch"
        assert pod.metadata.labels["kueue.x-k8s.io/queue-name"] == QUEUE
        core.delete_namespaced_pod(next(iter(fillers.values())), bob, grace_period_seconds=0)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "hello from helper" in out
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the run's pod and its Secret gone")
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone")


def _ctrl_c_of_a_queued_shell_run(origin: Any, core: Any, custom: Any, namespaces: list[str], tmp_path: Any,
                                  hold: str | None, methods: tuple[str, ...], after: str,
                                  release_after: str = "") -> str:
    """Start ``gpu-offload run`` with the pool full; with ``hold`` (a path regex), the matching request is held
    at the API server from the first one on. SIGINT is sent once the command printed ``after`` on stderr (if
    given) and the held request arrived, then the hold is released (once the command printed ``release_after``, if
    given). Returns the command's stderr after checking that it
    ended as Ctrl-C does and left no pod, Secret or Workload."""
    import signal
    import subprocess

    from ...cli.helpers import argv, write_project

    alice, bob, _ = namespaces
    fill_pool(core, bob)
    project = write_project(tmp_path / "proj")
    env = {**_shell(origin, tmp_path, alice), "GPU_OFFLOAD_QUEUE": QUEUE}
    rule = sandbox_faults(origin).api_hold(hold, methods=methods, times=0, longest=300.0) if hold else None
    proc = subprocess.Popen(argv("run", "main.py"), cwd=project.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        while after and after not in (line := proc.stderr.readline()):
            assert line, f"the command ended before it printed {after!r}: {''.join(lines)}"
            lines.append(line)
        lines.extend([line] if after else [])
        if rule is not None:
            wait_until(lambda: sandbox_faults(origin).api.faults.fired(rule) >= 1, "the command's request held")
        proc.send_signal(signal.SIGINT)  # what a terminal sends on Ctrl-C
        while release_after and release_after not in (line := proc.stderr.readline()):
            assert line, f"the command ended before it printed {release_after!r}: {''.join(lines)}"
            lines.append(line)
        lines.extend([line] if release_after else [])
        if rule is not None:
            sandbox_faults(origin).release(rule)
        out, err = proc.communicate(timeout=120)
    finally:
        if rule is not None:
            sandbox_faults(origin).clear()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(lines) + err
    assert proc.returncode == 130, err
    assert "hello from helper" not in out
    assert "Traceback" not in err, err
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the queued pod and its Secret gone", timeout=120)
    wait_until(lambda: not workloads(custom, alice), "the queued pod's Workload gone", timeout=120)
    return err


def test_ctrl_c_of_a_queued_gpu_offload_run_withdraws_it_and_leaves_nothing(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    err = _ctrl_c_of_a_queued_shell_run(origin, core, custom, namespaces, tmp_path, None, (), "queued for 1 GPU")
    assert "withdrawn from the queue (LocalQueue gpu-offload) after " in err, err


def test_ctrl_c_of_a_queued_gpu_offload_run_while_it_reads_its_place_in_line_withdraws_it(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    # every read of the visibility API hangs: the run is shown queued without its place, then Ctrl-C
    err = _ctrl_c_of_a_queued_shell_run(origin, core, custom, namespaces, tmp_path, "/pendingworkloads$", ("GET",),
                                        "queued for 1 GPU")
    assert "withdrawn from the queue (LocalQueue gpu-offload) after " in err, err


def test_ctrl_c_of_gpu_offload_run_while_its_pod_is_being_created_leaves_nothing(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    import signal
    import subprocess

    from ...cli.helpers import argv, write_project

    alice, bob, _ = namespaces
    fill_pool(core, bob)
    project = write_project(tmp_path / "proj")
    env = {**_shell(origin, tmp_path, alice), "GPU_OFFLOAD_QUEUE": QUEUE}
    faults = sandbox_faults(origin)
    create = faults.api_hold(rf"^/api/v1/namespaces/{alice}/pods$", methods=("POST",), longest=300.0)
    added: list[str] = []

    def record() -> None:  # the pods of alice's namespace as the API server adds them
        watch = kubernetes.watch.Watch()
        with contextlib.suppress(urllib3.exceptions.HTTPError):
            for event in watch.stream(core.list_namespaced_pod, alice, timeout_seconds=300):
                if event["type"] == "ADDED":
                    added.append(event["object"].metadata.name)
                    watch.stop()

    threading.Thread(target=record, daemon=True).start()
    proc = subprocess.Popen(argv("run", "main.py"), cwd=project.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: faults.api.faults.fired(create) >= 1, "the pod's create held")
        # the clean-up at the exit lists Jobs, pods, Services, Secrets in that order (the one at the start is done:
        # the create comes after it): a held list of Services means its list of pods was answered
        services = faults.api_hold(rf"^/api/v1/namespaces/{alice}/services$", methods=("GET",), longest=300.0)
        proc.send_signal(signal.SIGINT)  # Ctrl-C while the create is in flight
        wait_until(lambda: faults.api.faults.fired(services) >= 1, "the command's clean-up listed the pods")
        # only now does the API server create the pod the command's request was cut off from (a server that had
        # the whole request goes on with it), after the clean-up looked for pods
        faults.release(create)
        faults.release(services)
        out, err = proc.communicate(timeout=120)
    finally:
        faults.clear()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "gpu-offload: interrupted" in err and "Traceback" not in err, err
    wait_until(lambda: added, "the held create served")
    wait_until(lambda: not leftovers(core, alice, USERS[0]), "the pod created after Ctrl-C gone", timeout=120)
    wait_until(lambda: not workloads(custom, alice), "its Workload gone", timeout=120)


def test_ctrl_c_of_gpu_offload_run_while_it_reads_the_cluster_queue_leaves_nothing(
        origin: Any, kernels: list[KubernetesBackend], namespaces: list[str], core: Any, custom: Any,
        tmp_path: Any) -> None:
    # the first listing of the ClusterQueue (the never-fits check, before the pod is made) hangs when Ctrl-C comes
    err = _ctrl_c_of_a_queued_shell_run(origin, core, custom, namespaces, tmp_path,
                                        rf"^/apis/{KUEUE[0]}/{KUEUE[1]}/clusterqueues$", ("GET",), "")
    assert "gpu-offload: interrupted" in err and "withdrawn" not in err, err
