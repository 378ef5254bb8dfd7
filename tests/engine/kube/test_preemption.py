"""Preemption in words, on the sandbox with its Kueue and on the real cluster with real Kueue: a `batch` cell that holds the pool is preempted by an
`interactive` one; the batch runner gets SIGTERM first, its last output arrives, and the cell ends saying it
was preempted and that no variable came back; the interactive cell runs. A preempted session says its state
is gone.

The pool is one donor with 2 GPUs whose ClusterQueue quota an admin set to 1 GPU: the kernel's own placement
(which still looks for a node with a free GPU before it launches) finds one, while Kueue's quota is full.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from gpu_offload.liqo_peering import labels as L
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.objectstore import s3_server

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.errors import RemoteError

from ...origins import ONE_A100_PAIR_QUEUED
from ...realcluster.realorigin import torch_image
from ...sandbox.kueue_setup import synced_pool
from .conftest import BUCKET, kueue_origin_on_each_cluster, leftovers, settings
from .helpers import Sink, run_cell

KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE = "gpu-offload"
BATCH_CELL = """
import time
print('batch started', flush=True)
done = False
try:
    while True:
        time.sleep(0.1)
finally:
    print('batch saving a checkpoint', flush=True)
"""


origin = kueue_origin_on_each_cluster(ONE_A100_PAIR_QUEUED)  # shared with test_queued_distributed.py


@pytest.fixture(scope="module")
def pool(origin: Any, api_client: Any) -> str:
    """A user namespace with its LocalQueue, made by the project's own `gpu-offload queues sync`, and the
    ClusterQueue's GPU quota lowered to 1 by hand."""
    core = kubernetes.client.CoreV1Api(api_client)
    name = f"jhub-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
    synced_pool(origin.sandbox, name, gpu_quota=1)
    return name


@pytest.fixture()
def kernels(api_client: Any, pool: str) -> Iterator[list[KubernetesBackend]]:
    """Two kernels of the user, queueing (interactive by default, as a hub sets them)."""
    made = [KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive"), api_client) for _ in range(2)]
    yield made
    for backend in made:
        backend.close()
    core = kubernetes.client.CoreV1Api(api_client)
    wait_until(lambda: not leftovers(core, pool), "no pod or Secret left behind", timeout=60)


def _in_background(target: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["value"] = target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, result


def test_a_batch_cell_is_preempted_by_an_interactive_one_and_says_so(kernels: list[KubernetesBackend]) -> None:
    first, second = kernels
    started = threading.Event()
    batch_sink = Sink(on_line=lambda text: started.set() if "batch started" in text else None)
    namespace: dict[str, Any] = {"done": True}
    thread, batch = _in_background(lambda: run_cell(first, BATCH_CELL, namespace, batch_sink, priority="batch"))
    wait_until(started.is_set, "the batch cell running", timeout=120)

    outcome, sink, _ = run_cell(second, "print('interactive ran')", {}, priority="interactive")
    assert outcome.status == "ok", outcome.error
    assert "interactive ran" in sink.text

    thread.join(120)
    assert "error" not in batch, batch.get("error")
    preempted = batch["value"][0]
    assert isinstance(preempted.error, RemoteError) and preempted.error.ename == "Preempted", preempted.error
    words = preempted.error.evalue
    assert words.startswith("preempted after ") and "by a higher-priority run" in words, words
    assert "output so far is kept, no variable was copied back" in words
    assert "it had shown output already, so it is not rerun" in words and "--rerun-on-preemption" in words, words
    # SIGTERM came first: the cell's finally ran and its last line arrived; nothing was loaded
    assert "batch saving a checkpoint" in batch_sink.text
    assert namespace["done"] is True


def test_a_preempted_session_says_its_state_is_gone(kernels: list[KubernetesBackend]) -> None:
    first, second = kernels
    outcome, _, _ = run_cell(first, "x = 41", {}, session="work", priority="batch")
    assert outcome.status == "ok", outcome.error

    outcome, sink, _ = run_cell(second, "print('interactive ran')", {}, priority="interactive")
    assert outcome.status == "ok", outcome.error
    # the interactive cell could only run once the idle session's pod was gone; its kernel learns it from the
    # pod's end, as `%gpu_offload sessions` shows
    wait_until(lambda: not first.sessions(), "the preempted session no longer listed")
    assert "session work: its pod" in first.describe() and "was preempted after" in first.describe()

    outcome, sink, _ = run_cell(first, "print(x + 1)", {}, session="work", priority="batch")
    notices = " ".join(sink.notices)
    assert "session work: its pod" in notices and "was preempted after" in notices, notices
    assert "by a higher-priority run while idle" in notices and "variables of the old one are gone" in notices
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "NameError", outcome.error


def test_a_session_preempted_while_its_cell_runs_says_the_cell_and_the_state_are_gone(
        kernels: list[KubernetesBackend]) -> None:
    first, second = kernels
    outcome, _, _ = run_cell(first, "x = 41", {}, session="long", priority="batch")
    assert outcome.status == "ok", outcome.error
    started = threading.Event()
    sink = Sink(on_line=lambda text: started.set() if "batch started" in text else None)
    thread, batch = _in_background(lambda: run_cell(first, BATCH_CELL, {}, sink, session="long", priority="batch"))
    wait_until(started.is_set, "the session's cell running", timeout=120)

    outcome, _, _ = run_cell(second, "print('interactive ran')", {}, priority="interactive")
    assert outcome.status == "ok", outcome.error
    thread.join(120)
    assert "error" not in batch, batch.get("error")
    error = batch["value"][0].error
    assert isinstance(error, RemoteError) and error.ename == "Preempted", error
    assert error.evalue.startswith("preempted after ") and "Session long's state is gone with its pod" in error.evalue
    assert "batch saving a checkpoint" in sink.text


@pytest.fixture(scope="module")
def store(origin: Any) -> Iterator[str]:
    """Object storage (a moto server) that the kernel and the pods of this module's origin reach."""
    with s3_server(origin.host_address) as endpoint:
        yield endpoint


def test_a_checkpointed_session_preempted_while_idle_resumes_with_its_state(
        origin: Any, kernels: list[KubernetesBackend], api_client: Any, pool: str, store: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    from .test_session_survival import CHECK, SETUP, TORCH_IMAGE

    # the sandbox maps a pytorch image to its torch venv; on the real cluster, the torch image on donor-1's node
    torch = TORCH_IMAGE if hasattr(origin, "faults") else torch_image(api_client)

    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=store)
    s3.create_bucket(Bucket=BUCKET)
    first = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", trusted=("donor-1",),
                                       storage=StorageSettings(BUCKET, store)), api_client)
    try:
        for cell in (SETUP, CHECK):
            # pinned to a trusted cluster: a pod whose cluster Kueue picks runs as on an untrusted one
            outcome, sink, _ = run_cell(first, cell, {}, session="work", priority="batch", image=torch,
                                        cluster="donor-1")
            assert outcome.status == "ok", outcome.error
        before = sink.text
        first.keeper.settle("work")
        outcome, _, _ = run_cell(kernels[1], "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", outcome.error
        wait_until(lambda: not first.sessions(), "the preempted session no longer listed")
        assert "its next cell resumes it from checkpoint work (" in first.describe(), first.describe()

        outcome, sink, _ = run_cell(first, CHECK, {}, session="work", priority="batch", image=torch,
                                     cluster="donor-1")
        assert outcome.status == "ok", (outcome.error, sink.notices)
        assert sink.text == before, (sink.text, sink.notices)
        [note] = [n for n in sink.notices if "resumed on donor-1" in n]
        assert "was preempted after" in note and "by a higher-priority run while idle" in note, note
        assert "restored from checkpoint work: " in note and "model" in note and "opt" in note, note
        assert "not restored: guard (_thread.lock" in note, note
    finally:
        first.close()
    wait_until(lambda: not leftovers(kubernetes.client.CoreV1Api(api_client), pool), "nothing left", timeout=60)
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


@pytest.mark.parametrize("prints", [False, True], ids=["silent", "printed-and-asked"])
def test_a_preempted_one_shot_cell_is_requeued_and_rerun_once(kernels: list[KubernetesBackend], store: str,
                                                              prints: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    first, second = kernels
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=store)
    bucket = f"marks-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    # the first attempt leaves a mark in object storage (which pods reach wherever they run) and waits; the
    # rerun finds the mark and finishes
    get, put = (s3.generate_presigned_url(m, Params={"Bucket": bucket, "Key": "mark"}) for m in ("get_object", "put_object"))
    say = "print('first attempt', flush=True)" if prints else "pass"
    cell = (f"import time, urllib.request, urllib.error\ntry:\n    urllib.request.urlopen({get!r}).read()\n"
            f"except urllib.error.HTTPError:\n    urllib.request.urlopen(urllib.request.Request({put!r}, data=b'1', "
            f"method='PUT')).read()\n    {say}\n    time.sleep(600)\nv = 7\n")
    marked = lambda: s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 1  # noqa: E731
    namespace: dict[str, Any] = {}
    thread, batch = _in_background(lambda: run_cell(first, cell, namespace, priority="batch",
                                                    rerun_on_preemption=prints))
    try:
        wait_until(marked, "the first attempt running", timeout=120)
        outcome, _, _ = run_cell(second, "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", outcome.error
        thread.join(180)
    finally:
        s3.delete_object(Bucket=bucket, Key="mark")
        s3.delete_bucket(Bucket=bucket)
    assert "error" not in batch, batch.get("error")
    outcome, sink, _ = batch["value"]
    assert outcome.status == "ok", (outcome.error, sink.notices)
    assert namespace["v"] == 7
    [note] = [n for n in sink.notices if "queued again and rerun once" in n]
    assert "preempted after " in note and "by a higher-priority run" in note, note
    if prints:
        assert "as --rerun-on-preemption asks" in note and sink.text.count("first attempt") == 1, (note, sink.text)
    else:
        assert "before it showed any output" in note and sink.text == "", (note, sink.text)


@pytest.fixture()
def protected(origin: Any, api_client: Any) -> Iterator[str]:
    """The hub's protected WorkloadPriorityClass, outranking every class of the pool (on real Kueue 0.19.2 too:
    its jobframework follows a running pod's changed class into the Workload's priority)."""
    custom = kubernetes.client.CustomObjectsApi(api_client)
    name = f"protected-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
        "apiVersion": "/".join(KUEUE), "kind": "WorkloadPriorityClass", "metadata": {"name": name},
        "value": 100000})
    yield name
    custom.delete_cluster_custom_object(*KUEUE, "workloadpriorityclasses", name)


def test_a_protected_session_is_listed_as_protected_until_its_protection_ends(
        api_client: Any, pool: str, protected: str) -> None:
    # a protection of 10 min: no relabel can come before the reading however loaded the machine (the
    # preemption test below uses 8 s, gone before a late reading)
    backend = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", session_protection=600.0,
                                         protected_priority=protected), api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    try:
        outcome, _, _ = run_cell(backend, "x = 41", {}, session="work", priority="batch")
        assert outcome.status == "ok", outcome.error
        # the protection counts from the runner's start, which the kernel's watch sees a moment after the cell
        [info] = wait_until(lambda: [i for i in backend.sessions() if i.release], "the session's protection listed")
        assert info.release.startswith("protected from preemption until "), info
        assert f"(in 10 min; priority class {protected}, then batch)" in info.release or (
            f"(in 9 min; priority class {protected}, then batch)" in info.release), info
        [pod] = core.list_namespaced_pod(pool).items
        assert pod.metadata.labels["kueue.x-k8s.io/priority-class"] == protected
        # Kueue took the class from the label: the pod's Workload runs at the protected priority
        custom = kubernetes.client.CustomObjectsApi(api_client)
        [workload] = [w for w in custom.list_namespaced_custom_object(*KUEUE, pool, "workloads")["items"]
                      if any(ref.get("name") == pod.metadata.name for ref in w["metadata"].get("ownerReferences", []))]
        assert workload["spec"]["priorityClassRef"]["name"] == protected, workload["spec"]
        assert workload["spec"]["priority"] == 100000, workload["spec"]
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, pool), "nothing left", timeout=60)


def test_a_protected_session_is_preempted_only_after_its_protection_time(
        kernels: list[KubernetesBackend], api_client: Any, pool: str, protected: str) -> None:
    """The hub's session protection: a session pod is raised to the protected class once its runner runs, which
    the pool's runs do not outrank; the kernel lowers it to its own class (batch) once it ran for the protection
    time, and only then does Kueue let the interactive cell that waits for its GPU preempt it."""
    seconds = 8.0
    first = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", session_protection=seconds,
                                       protected_priority=protected), api_client)
    try:
        outcome, _, _ = run_cell(first, "x = 41", {}, session="work", priority="batch")
        assert outcome.status == "ok", outcome.error

        outcome, sink, _ = run_cell(kernels[1], "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", outcome.error
        wait_until(lambda: not first.sessions(), "the preempted session no longer listed")
        status = first.describe()
        ran = re.search(r"session work: its pod \S+ was preempted after (\d+) s by a higher-priority run", status)
        assert ran is not None, status
        # preempted only once the protection was over, counted from the runner's start
        assert int(ran.group(1)) >= seconds - 1, status
    finally:
        first.close()
    wait_until(lambda: not leftovers(kubernetes.client.CoreV1Api(api_client), pool), "nothing left", timeout=60)


def test_a_protected_session_waits_in_line_at_its_own_class_and_is_raised_once_it_runs(
        kernels: list[KubernetesBackend], api_client: Any, pool: str, protected: str) -> None:
    """Protection is a minimum runtime, not a place in line: a session of class batch that asks for the pool's one
    GPU while another batch run holds it waits for that run to end (it used to wait at the protected class and
    preempted the run at once, which on a saturated pool had sessions preempting one another: the sessions trace
    replay); once its runner runs, its pod is raised to the protected class."""
    started = threading.Event()
    holder_sink = Sink(on_line=lambda text: started.set() if "holder started" in text else None)
    cell = "import time\nprint('holder started', flush=True)\ntime.sleep(6)\nprint('holder done')\n"
    thread, holder = _in_background(lambda: run_cell(kernels[1], cell, {}, holder_sink, priority="batch"))
    wait_until(started.is_set, "the batch run holding the GPU", timeout=120)
    first = KubernetesBackend(settings(pool, queue=QUEUE, priority="interactive", session_protection=600.0,
                                       protected_priority=protected), api_client)
    core = kubernetes.client.CoreV1Api(api_client)
    try:
        outcome, _, _ = run_cell(first, "x = 41", {}, session="work", priority="batch")
        assert outcome.status == "ok", outcome.error
        thread.join(120)
        assert "error" not in holder, holder.get("error")
        held, sink, _ = holder["value"]
        # the holder was not preempted by the session that waited behind it
        assert held.status == "ok", (held.error, sink.notices)
        assert "holder done" in sink.text and not [n for n in sink.notices if "preempted" in n], sink.notices
        [pod] = wait_until(lambda: [p for p in core.list_namespaced_pod(pool).items
                                    if (p.metadata.labels or {}).get("kueue.x-k8s.io/priority-class") == protected],
                           "the session's pod raised to the protected class once it runs")
        assert pod.status.phase == "Running", pod.status.phase
    finally:
        first.close()
    wait_until(lambda: not leftovers(core, pool), "nothing left", timeout=60)


def test_gpu_offload_run_preempted_by_an_interactive_cell_ends_saying_so_and_leaves_nothing(
        origin: Any, kernels: list[KubernetesBackend], api_client: Any, pool: str, tmp_path: Any) -> None:
    """`gpu-offload run --priority batch` holds the pool's one GPU of quota and prints; an interactive cell makes
    Kueue preempt it. The command ends saying so in a command's words (not a cell's), and, its script having
    printed, that it was not rerun and how to have it rerun (`--rerun-on-preemption`); its pod and Secret are
    gone."""
    import subprocess

    from ...cli.helpers import argv, environment, write_project

    project = write_project(tmp_path / "proj")
    env = environment(tmp_path / "state", KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_NAMESPACE=pool,
                      GPU_OFFLOAD_IMAGE=settings(pool).image, JUPYTERHUB_USER="alice@example.org",
                      GPU_OFFLOAD_QUEUE=QUEUE)
    proc = subprocess.Popen(argv("run", "--priority", "batch", "main.py", "sleep"), cwd=project.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while "hello from helper" not in (line := proc.stdout.readline()):  # the script runs on the GPU
            assert line, f"the command ended before its script printed: {proc.communicate()}"
        outcome, _, _ = run_cell(kernels[1], "print('interactive ran')", {}, priority="interactive")
        assert outcome.status == "ok", outcome.error
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode not in (0, None), (out, err)
    assert "Preempted: preempted after " in err and "by a higher-priority run" in err, err
    assert "it had shown output already, so it is not rerun" in err and "--rerun-on-preemption" in err, err
    # in a command's words, not a cell's
    assert ("its output so far is shown above. Run the command again to queue it once more, or with --priority"
            in err), err
    assert "to have such a run requeued" in err and "cell" not in err, err
    assert "Traceback" not in err, err
    wait_until(lambda: not leftovers(kubernetes.client.CoreV1Api(api_client), pool), "the run's pod and Secret gone",
               timeout=120)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    wait_until(lambda: not custom.list_namespaced_custom_object(*KUEUE, pool, "workloads")["items"],
               "the run's Workload gone", timeout=120)


def test_a_real_kernels_cell_waits_in_line_shows_its_place_and_kueues_reason_and_runs_once_admitted(
        origin: Any, kernels: list[KubernetesBackend], api_client: Any, pool: str, tmp_path: Any) -> None:
    """A real Jupyter kernel (as a user's server starts one) whose magic builds its backend from the environment
    a hub gives it. Its `%%gpu_offload` cell waits behind a run that holds the pool's quota (at the same priority:
    no preemption); the cell's notice output shows its place in line and Kueue's reason while it waits; once the
    holder ends Kueue admits it, it runs, and its variable is in the kernel. One real node is enough (the pool is
    one donor)."""
    import uuid

    from jupyter_client.manager import KernelManager

    from ...magics.conftest import Kernel

    core = kubernetes.client.CoreV1Api(api_client)
    offloading = L.NAMESPACE_OFFLOADING
    with contextlib.suppress(kubernetes.client.ApiException):  # as the hub's spawner offloads a user namespace
        kubernetes.client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            offloading.group, offloading.version, pool, offloading.plural, namespace_offloading(pool))
    holder = ["holder"]
    core.create_namespaced_pod(pool, {  # a pod of another run in the user's queue, as high a priority as the cell
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": holder[0], "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                                                   "kueue.x-k8s.io/priority-class": "interactive"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": settings(pool).image, "command": ["python3", "-c", "import time; time.sleep(600)"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}]}})
    wait_until(lambda: core.read_namespaced_pod(holder[0], pool).status.phase == "Running", "the holder running",
               timeout=120)
    # the kernel gets only the settings a hub gives a user server (this process may hold others)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_OFFLOAD_") or k == "GPU_OFFLOAD_TEST_RUN"}
    env.update(KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_NAMESPACE=pool, GPU_OFFLOAD_IMAGE=settings(pool).image,
               GPU_OFFLOAD_KERNEL_ID=f"k-{uuid.uuid4().hex[:8]}", JUPYTERHUB_USER="alice@example.org", GPU_OFFLOAD_QUEUE=QUEUE,
               GPU_OFFLOAD_PRIORITY="interactive", GPU_OFFLOAD_STATE_DIR=str(tmp_path / "state"))
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path), env=env)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        kernel = Kernel(manager, client)
        reply, _ = kernel.execute("%load_ext gpu_offload.magics")
        assert reply["status"] == "ok", reply
        seen: list[str] = []

        def notices(msg: dict[str, Any]) -> None:
            text = (msg["content"].get("data") or {}).get("text/plain", "")
            if msg["msg_type"] in ("display_data", "update_display_data") and text.startswith("gpu_offload: "):
                seen.append(text)
                if "  Kueue: " in text and holder:  # waiting, with Kueue's words: free the quota
                    core.delete_namespaced_pod(holder.pop(), pool, grace_period_seconds=0)

        reply, outputs = kernel.execute("%%gpu_offload --gpus 1\nanswer = 6 * 7\nprint('ran after the wait')",
                                        on_output=notices, timeout=300)
        assert reply["status"] == "ok", (reply, seen)
        assert "ran after the wait" in Kernel.text(outputs), outputs
        waiting = next(t for t in seen if "  Kueue: " in t)
        # "1st of 1" once the ClusterQueue's status counts it, "1st" before
        assert re.search(r"queued for 1 GPU: 1st (of 1 )?in line; waiting ", waiting), waiting
        assert "  Kueue: couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu" in (
            waiting), waiting
        assert any("admitted by Kueue after " in t for t in seen), seen
        reply, outputs = kernel.execute("print(answer)")
        assert Kernel.text(outputs) == "42\n", outputs
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
    assert not holder, "the cell never showed Kueue's reason while it waited"
    wait_until(lambda: not leftovers(core, pool), "the cell's pod and Secret gone", timeout=60)
