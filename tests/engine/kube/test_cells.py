"""Cells on the kubernetes backend, on the sandbox and on the real cluster (real API server, scheduler, kubelets
and containers; Liqo's objects seeded): output and variables come back, stock images work, a dropped log stream
loses and repeats nothing, Ctrl-C deletes the pod, and nothing is left behind."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from gpu_offload.liqo_peering.specs import runner_selector
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError, RemoteError

from .conftest import MISMATCH_IMAGE, leftovers, origin_on_each_cluster, sandbox_faults, settings
from .helpers import Sink, run_cell

origin = origin_on_each_cluster()


def test_a_cell_runs_on_a_stock_image_and_its_variables_come_back(kube: KubernetesBackend, core: Any,
                                                                  namespace: str) -> None:
    user_ns: dict[str, Any] = {"x": 20}
    cell = "import sys\nprint('hello from', sys.prefix)\ny = x + 1\ntry:\n    import gpu_offload\nexcept ImportError:\n    print('no gpu_offload in this image')"
    outcome, sink, run = run_cell(kube, cell, user_ns)
    assert outcome.status == "ok", outcome.error
    assert user_ns["y"] == 21
    assert "no gpu_offload in this image" in sink.text  # the runner travelled in the Secret
    assert run.current.ctx.cluster == "donor-2"  # most free GPUs: 8 L4 against 4 A100
    wait_until(lambda: not leftovers(core, namespace), "pod and Secret deleted after the run")


def test_the_pod_is_restricted_labelled_and_bounded_by_the_timeout(kube: KubernetesBackend, core: Any,
                                                                   namespace: str) -> None:
    seen: dict[str, Any] = {}

    def grab(_: str) -> None:
        pods = core.list_namespaced_pod(namespace, label_selector=runner_selector("alice@example.org")).items
        seen["pod"] = pods[0]

    outcome, _, _ = run_cell(kube, "print('look at me', flush=True)\nimport time\ntime.sleep(0.5)", {},
                             Sink(on_line=grab), timeout=60)
    assert outcome.status == "ok", outcome.error
    pod = seen["pod"]
    assert pod.spec.automount_service_account_token is False
    container = pod.spec.containers[0]
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.metadata.labels["gpu-offload.io/kernel"] == kube.settings.kernel
    assert pod.metadata.labels["gpu-offload.io/user"].startswith("alice-example.org")
    assert pod.spec.active_deadline_seconds == 60 + 30  # --timeout plus a margin: the engine interrupts first
    assert container.resources.limits["nvidia.com/gpu"] == "1"


def test_the_runner_memory_follows_a_notebooks_env_from_the_next_cell(kube: KubernetesBackend, core: Any,
                                                                        namespace: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # what an out-of-memory failure tells the user to do: `%env GPU_OFFLOAD_MEMORY=...` before the next cell
    limits: list[dict[str, str]] = []

    def grab(_: str) -> None:
        pods = core.list_namespaced_pod(namespace, label_selector=runner_selector("alice@example.org")).items
        limits.append(dict(pods[0].spec.containers[0].resources.limits or {}))

    monkeypatch.delenv("GPU_OFFLOAD_MEMORY", raising=False)
    for memory in (None, "3Gi"):
        if memory is not None:
            monkeypatch.setenv("GPU_OFFLOAD_MEMORY", memory)
        outcome, _, _ = run_cell(kube, "print('sized', flush=True)\nimport time\ntime.sleep(0.5)", {},
                                 Sink(on_line=grab))
        assert outcome.status == "ok", outcome.error
        wait_until(lambda: not leftovers(core, namespace), "pod and Secret deleted after the run")
    assert "memory" not in limits[0] and limits[-1]["memory"] == "3Gi", limits


def test_a_dropped_log_stream_resumes_without_losing_or_repeating_a_line(kube: KubernetesBackend, core: Any,
                                                                         origin: Any, namespace: str) -> None:
    faults = sandbox_faults(origin)
    cut = threading.Event()

    def cut_once(text: str) -> None:
        if "line 3" in text and not cut.is_set():
            cut.set()
            for pod in core.list_namespaced_pod(namespace).items:
                faults.cut_logs(namespace, pod.metadata.name)

    cell = "import time\nfor i in range(12):\n    print('line', i, flush=True)\n    time.sleep(0.15)"
    outcome, sink, run = run_cell(kube, cell, {}, Sink(on_line=cut_once))
    assert cut.is_set()
    assert outcome.status == "ok", outcome.error
    assert sink.text.splitlines() == [f"line {i}" for i in range(12)]
    assert run.current.follower.resumes >= 1


def test_a_refused_log_stream_is_resumed_after_a_backoff_without_losing_or_repeating_a_line(
        kube: KubernetesBackend, core: Any, origin: Any, namespace: str) -> None:
    sandbox_faults(origin)
    refusing: list[Any] = []
    refused: list[int] = []

    def stop_refusing() -> None:
        refused.append(origin.sandbox.api.faults.fired(refusing[0]))
        origin.sandbox.api.faults.remove(refusing[0])

    def cut_and_refuse(text: str) -> None:
        if "line 3" in text and not refusing:
            # 500, not 503: the client's urllib3 would itself retry a 503 that carries Retry-After.
            refusing.append(origin.faults.api_error(rf"^/api/v1/namespaces/{namespace}/pods/[^/]+/log$", status=500))
            for pod in core.list_namespaced_pod(namespace).items:
                origin.faults.cut_logs(namespace, pod.metadata.name)
            threading.Timer(1.5, stop_refusing).start()

    cell = "import time\nfor i in range(20):\n    print('line', i, flush=True)\n    time.sleep(0.15)"
    outcome, sink, run = run_cell(kube, cell, {}, Sink(on_line=cut_and_refuse))
    assert refusing
    assert outcome.status == "ok", outcome.error
    assert sink.text.splitlines() == [f"line {i}" for i in range(20)]
    # 1.5 s of refusals met waits of 0.25-0.5, 0.5-1 and 1-2 s: a few tries, where a loop without
    # delay asks hundreds of times
    assert 1 <= refused[0] <= 5, refused
    assert run.current.follower.resumes >= 2


def test_ctrl_c_deletes_the_pod_and_copies_nothing_back(kube: KubernetesBackend, core: Any, namespace: str) -> None:
    def interrupt(text: str) -> None:
        if "started" in text:
            raise KeyboardInterrupt

    user_ns: dict[str, Any] = {"x": "before"}
    with pytest.raises(KeyboardInterrupt):
        run_cell(kube, "import time\nx = 'after'\nprint('started', flush=True)\ntime.sleep(300)", user_ns,
                 Sink(on_line=interrupt))
    assert user_ns["x"] == "before"
    wait_until(lambda: not leftovers(core, namespace), "the interrupted pod deleted")


def test_a_remote_error_keeps_the_output_before_it(kube: KubernetesBackend) -> None:
    outcome, sink, _ = run_cell(kube, "print('partial')\nraise ValueError('bad value')", {})
    assert isinstance(outcome.error, RemoteError) and "bad value" in str(outcome.error)
    assert "partial" in sink.text


def test_a_python_minor_mismatch_is_one_sentence_from_the_first_frame(kube: KubernetesBackend, origin: Any) -> None:
    if not hasattr(origin, "faults"):
        pytest.skip(f"{MISMATCH_IMAGE} is the sandbox's image map (another Python); the real nodes have no such image")
    outcome, _, _ = run_cell(kube, "print('never')", {}, image=MISMATCH_IMAGE)
    assert isinstance(outcome.error, RemoteError), outcome
    assert outcome.error.ename == "PythonVersionMismatch"
    assert "3.12" in outcome.error.evalue and "3.11" in outcome.error.evalue


def test_a_bundle_too_large_for_a_secret_without_storage_fails_before_launch(kube: KubernetesBackend, core: Any,
                                                                              namespace: str) -> None:
    big = b"x" * (2 << 20)
    with pytest.raises(OffloadUsageError) as err:
        run_cell(kube, "print(len(big))", {"big": big})
    message = str(err.value)
    assert "MiB" in message and "GPU_OFFLOAD_S3_BUCKET" in message and "Nothing was launched" in message
    assert leftovers(core, namespace) == []


def test_a_restarted_kernel_removes_what_its_crashed_predecessor_left(api_client: Any, core: Any,
                                                                      namespace: str) -> None:
    crashed = KubernetesBackend(settings(namespace, kernel="kernel-crash"), api_client)
    from gpu_offload.engine.analysis import analyse_cell
    from gpu_offload.engine.backends.base import RunRequest
    from gpu_offload.engine.bundle import build_job

    cell = "import time\ntime.sleep(300)"
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, crashed.transfer, request=RunRequest(gpus=1))
    run = crashed.submit(job)
    run.current.follower.stop()  # the kernel died here: nobody follows, nobody releases
    assert leftovers(core, namespace)
    restarted = KubernetesBackend(settings(namespace, kernel="kernel-crash"), api_client)
    try:
        assert sorted(restarted.cleaned) == sorted([run.current.name, f"{run.current.name}-runner"])
        wait_until(lambda: not leftovers(core, namespace), "leftovers of the crashed kernel removed")
    finally:
        restarted.close()
        crashed.close()


def test_a_run_released_mid_cell_gets_the_grace_period_to_end_its_cell(kube: KubernetesBackend, core: Any,
                                                                       namespace: str) -> None:
    # release(grace) before the cell's end (the engine's own follow failed, or the kernel lets go of a run):
    # the runner gets SIGTERM, so the cell's cleanup runs, and the pod goes once the grace period is over.
    # The cleanup is seen in the pod's log, as on a cluster: the pod's container cannot write the test's files.
    from gpu_offload.engine.analysis import analyse_cell
    from gpu_offload.engine.backends.base import RunRequest
    from gpu_offload.engine.bundle import build_job
    from gpu_offload.runner.frames import Stream

    cell = ("import time\nprint('started', flush=True)\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
            "    print('cleaned', 'up', flush=True)\n    raise")
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, kube.transfer, request=RunRequest(gpus=1))
    run = kube.submit(job)
    wait_until(lambda: isinstance(event := run.next_event(0.5), Stream) and "started" in event.text,
               "the cell started")
    log = core.read_namespaced_pod_log(run.current.name, namespace, follow=True, _preload_content=False)
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(log.stream(1)), daemon=True)
    reader.start()
    run.release(20)
    wait_until(lambda: not leftovers(core, namespace), "pod and Secret deleted after the grace period")
    reader.join(timeout=30)
    assert b"cleaned up" in b"".join(lines), "the cell's cleanup did not run (a SIGKILL skips it)"


def test_the_cell_says_which_pod_virtual_node_and_cluster_it_runs_on(kube: KubernetesBackend, core: Any,
                                                                     namespace: str) -> None:
    seen: dict[str, str] = {}

    def grab(_: str) -> None:
        [pod] = core.list_namespaced_pod(namespace, label_selector=runner_selector("alice@example.org")).items
        seen.update(name=pod.metadata.name, node=pod.spec.node_name)

    outcome, sink, _ = run_cell(kube, "print('here')", {}, Sink(on_line=grab), gpu_model="A100")
    assert outcome.status == "ok", outcome.error
    assert seen["node"] == "donor-1-gpu"
    # (a container slower to start than the engine's first progress note, as real ones are, adds "no output yet")
    said = [n for n in sink.notices if not n.startswith("no output yet after ")]
    assert said == [f"running in pod {seen['name']} on virtual node donor-1-gpu (Liqo cluster donor-1, 1 x A100)"]


def test_ipython_display_helpers_work_on_a_stock_image_without_ipython(api_client: Any, namespace: str,
                                                                       core: Any) -> None:
    backend = KubernetesBackend(settings(namespace, trusted=("donor-1", "donor-2")), api_client)  # unsanitized
    cell = ("from IPython.display import display, HTML, Markdown, Image\nimport IPython\n"
            "print('IPython installed:', getattr(IPython, '__file__', None) is not None)\n"
            "display(HTML('<b>bold</b>'), Markdown('*it*'))\ndisplay(Image(b'\\x89PNG\\r\\n\\x1a\\nxx', width=20))\n")
    try:
        outcome, sink, _ = run_cell(backend, cell, {})  # the kube fixture's image: python:3.11-slim, stock
    finally:
        backend.close()
    assert outcome.status == "ok", outcome.error
    assert sink.text == "IPython installed: False\n"
    html, markdown, image = sink.displays_with_metadata
    assert html == ({"text/html": "<b>bold</b>", "text/plain": "<IPython.core.display.HTML object>"}, {})
    assert markdown == ({"text/markdown": "*it*", "text/plain": "<IPython.core.display.Markdown object>"}, {})
    assert image == ({"image/png": "iVBORw0KGgp4eA==", "text/plain": "<IPython.core.display.Image object>"},
                     {"image/png": {"width": 20}})
    wait_until(lambda: not leftovers(core, namespace), "pod and Secret deleted after the run")
