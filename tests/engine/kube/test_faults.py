"""Every fault the sandbox can inject ends the cell with a sentence the user understands and leaves no pod,
Secret or process behind (listed by label after each test, by the ``kube`` fixture)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.explain import MEMORY_ENV
from gpu_offload.engine.errors import OffloadError, RemoteError

from .conftest import STOCK_IMAGE, leftovers, settings
from .helpers import Sink, run_cell

SLOW_CELL = "import time\nprint('started', flush=True)\ntime.sleep(120)\nprint('never')"


@pytest.fixture(autouse=True)
def clear_faults(origin: Any) -> Iterator[None]:
    yield
    origin.faults.clear()


def _on_start(action: Any) -> Sink:
    fired = threading.Event()

    def hook(text: str) -> None:
        if "started" in text and not fired.is_set():
            fired.set()
            action()

    return Sink(on_line=hook)


def _pod(core: Any, namespace: str) -> Any:
    return wait_until(lambda: next(iter(core.list_namespaced_pod(namespace).items), None), "the runner pod")


def test_out_of_memory_names_the_cluster_the_gpus_and_how_to_ask_for_more(kube: KubernetesBackend, core: Any,
                                                                          origin: Any, namespace: str) -> None:
    def oom() -> None:
        origin.call(origin.faults.oom_kill(namespace, _pod(core, namespace).metadata.name))

    outcome, sink, _ = run_cell(kube, SLOW_CELL, {}, _on_start(oom), gpu_model="A100")
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "OOMKilled", outcome.error
    message = outcome.error.evalue
    assert "out of memory on donor-1 with 1 GPU" in message and MEMORY_ENV in message
    assert "started" in sink.text and "never" not in sink.text


def test_an_image_that_cannot_be_pulled_is_named(kube: KubernetesBackend) -> None:
    outcome, _, _ = run_cell(kube, "print('never')", {}, image="registry.invalid/no-such-image:1")
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "ImagePullBackOff", outcome.error
    assert "registry.invalid/no-such-image:1" in outcome.error.evalue and "--image" in outcome.error.evalue


def test_an_image_made_unpullable_by_a_fault_is_named(kube: KubernetesBackend, origin: Any) -> None:
    origin.faults.image_unavailable("python:3.11-slim")
    outcome, _, _ = run_cell(kube, "print('never')", {})
    assert isinstance(outcome.error, RemoteError) and "python:3.11-slim" in outcome.error.evalue


def test_memory_no_node_has_fails_before_launch_saying_what_is_free(kube: KubernetesBackend, core: Any,
                                                                     namespace: str, monkeypatch: Any) -> None:
    monkeypatch.setenv(MEMORY_ENV, "900Ti")  # every donor's node has 128Gi
    with pytest.raises(OffloadError) as err:
        run_cell(kube, "print('never')", {})
    message = str(err.value)
    assert "921600.0 GiB of memory" in message and "at most 128.0 GiB of memory free" in message, message
    assert MEMORY_ENV in message
    assert leftovers(core, namespace) == []


def test_a_memory_setting_that_is_not_a_quantity_is_named_and_nothing_launches(kube: KubernetesBackend, core: Any,
                                                                               namespace: str,
                                                                               monkeypatch: Any) -> None:
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(OffloadError) as err:
        run_cell(kube, "print('never')", {})
    assert f"{MEMORY_ENV}='lots' is not a Kubernetes memory quantity" in str(err.value)
    assert "Nothing was launched" in str(err.value)
    assert leftovers(core, namespace) == []


def test_a_namespace_no_longer_offloaded_is_offloading_backoff(kube: KubernetesBackend, origin: Any,
                                                                namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "print('ok')", {})
    assert outcome.status == "ok", outcome.error
    # the namespace owner stops offloading; this kernel still believes it is offloaded
    custom = __import__("kubernetes").client.CustomObjectsApi(kube.api_client)
    custom.delete_namespaced_custom_object("offloading.liqo.io", "v1beta1", namespace, "namespaceoffloadings",
                                           "offloading")
    outcome, _, _ = run_cell(kube, "print('never')", {})
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "OffloadingBackOff", outcome.error
    assert f"namespace {namespace} is not offloaded" in outcome.error.evalue


def test_without_rights_to_offload_the_magic_says_who_must_act(api_client: Any, core: Any, namespace: str) -> None:
    backend = KubernetesBackend(settings(namespace, create_offloading=False), api_client)
    try:
        with pytest.raises(OffloadError) as err:
            run_cell(backend, "print('never')", {})
        assert "not offloaded" in str(err.value) and "admin" in str(err.value)
        assert leftovers(core, namespace) == []
    finally:
        backend.close()


def test_api_errors_on_pod_creation_leave_nothing_behind(kube: KubernetesBackend, core: Any, origin: Any,
                                                         namespace: str) -> None:
    origin.faults.api_error(r"^/api/v1/namespaces/[^/]+/secrets$", status=500, methods=("POST",))
    with pytest.raises(OffloadError) as err:
        run_cell(kube, "print('never')", {})
    assert "Secret" in str(err.value) and "Nothing is left running" in str(err.value)
    wait_until(lambda: not leftovers(core, namespace), "the pod whose Secret failed deleted")


def test_an_evicted_pod_says_the_donor_needed_the_resources(kube: KubernetesBackend, core: Any, origin: Any,
                                                            namespace: str) -> None:
    def evict() -> None:
        origin.call(origin.faults.evict(namespace, _pod(core, namespace).metadata.name))

    outcome, sink, _ = run_cell(kube, SLOW_CELL, {}, _on_start(evict))
    assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "Evicted", outcome.error
    assert "evicted from donor-2" in outcome.error.evalue and "started" in sink.text


def test_a_503_on_pod_creation_is_retried_by_the_client(kube: KubernetesBackend, origin: Any) -> None:
    rule = origin.faults.api_error(r"^/api/v1/namespaces/[^/]+/pods$", status=503, methods=("POST",), times=1)
    outcome, sink, _ = run_cell(kube, "print('after a 503')", {})
    assert outcome.status == "ok", outcome.error
    assert "after a 503" in sink.text and origin.sandbox.api.faults.fired(rule) == 1


def test_a_cell_whose_finished_log_cannot_be_read_at_once_still_completes(kube: KubernetesBackend,
                                                                          origin: Any) -> None:
    # every log read refused for a while: the container finishes meanwhile and the first reads of its ended log
    # fail too. The run reads it again until the done frame arrives, instead of calling the cell's runner dead
    # ("exit code 0", seen once on the real cluster under load)
    rule = origin.faults.api_error(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/log$", status=500, methods=("GET",),
                                   times=6)
    outcome, sink, _ = run_cell(kube, "import time\ntime.sleep(2)\nprint('end', flush=True)\nx = 1", {})
    assert outcome.status == "ok", outcome.error
    assert "end" in sink.text and origin.sandbox.api.faults.fired(rule) == 6


def _pulling(sink: Sink) -> list[str]:
    return [n for n in sink.notices if f"; pulling image {STOCK_IMAGE} for " in n]


def test_a_pod_pulling_its_image_says_so_and_estimates_from_the_earlier_pull(kube: KubernetesBackend,
                                                                              origin: Any) -> None:
    """Issue 27 "why am I waiting": the kubelet's Pulling and Pulled events (the sandbox writes them in a kubelet's
    words) are what the waiting cell shows, with an estimate once the namespace's events hold an earlier pull."""
    origin.faults.slow_pull(STOCK_IMAGE, 6.0, 123 * 2**20)
    outcome, sink, _ = run_cell(kube, "print('pulled')", {})
    assert outcome.status == "ok" and sink.text == "pulled\n", (outcome.error, sink.notices)
    words = _pulling(sink)
    assert words and "; no earlier pull of it in this namespace to estimate from (Kubernetes keeps events about an " \
                     "hour)" in words[0], sink.notices
    origin.faults.slow_pull(STOCK_IMAGE, 6.0, 123 * 2**20)  # a new push of the image: no node has it
    outcome, sink, _ = run_cell(kube, "print('pulled again')", {})
    assert outcome.status == "ok" and sink.text == "pulled again\n", (outcome.error, sink.notices)
    words = _pulling(sink)
    assert words and "; earlier pulls of it in this namespace took about 6 s (one pull; 123 MiB): " in words[0], \
        sink.notices
    assert words[0].endswith(" s left") or words[0].endswith("the slowest took 6 s)"), words


def _bound(core: Any, namespace: str) -> Any:
    return wait_until(lambda: next((p for p in core.list_namespaced_pod(namespace).items if p.spec.node_name), None),
                      "the runner pod bound to a node")


def _cordon_in_thread(kube: KubernetesBackend, core: Any, namespace: str, others_too: bool,
                      cordoned: list[str]) -> threading.Thread:
    """Once the cell's pod is bound (and pulling), cordon its node, as a drain's first step; with ``others_too``
    every other donor's node first, so nothing else has room."""
    def cordon() -> None:
        node = _bound(core, namespace).spec.node_name
        others = [n.metadata.name for n in core.list_node().items
                  if n.metadata.name != node and n.metadata.name.endswith("-gpu")] if others_too else []
        for name in [*others, node]:
            cordoned.append(name)
            core.patch_node(name, {"spec": {"unschedulable": True}})
            wait_until(lambda name=name: any(vn.name == name and vn.cordoned
                                             for vn in kube.inventory().inventory().virtual_nodes),
                       f"the kernel's inventory sees {name} cordoned")

    thread = threading.Thread(target=cordon)
    thread.start()
    return thread


@pytest.mark.parametrize("others_too", [False, True], ids=["moves", "waits"])
def test_a_pod_waiting_on_a_donor_being_drained_moves_or_says_it_waits(kube: KubernetesBackend, origin: Any,
                                                                      core: Any, namespace: str,
                                                                      others_too: bool) -> None:
    origin.faults.slow_pull(STOCK_IMAGE, 10.0)
    cordoned: list[str] = []
    thread = _cordon_in_thread(kube, core, namespace, others_too, cordoned)
    try:
        outcome, sink, _ = run_cell(kube, "print('ran')", {})
    finally:
        thread.join()
        for name in cordoned:
            core.patch_node(name, {"spec": {"unschedulable": None}})
    assert outcome.status == "ok" and sink.text == "ran\n", (outcome.error, sink.notices)
    node = cordoned[-1]
    why = f"donor {node.removesuffix('-gpu')} is being drained (its node {node} is cordoned)"
    [note] = [n for n in sink.notices if "is being drained" in n]
    if others_too:
        assert note == (f"warning: {why}, and no other donor has room for this cell (--gpus 1): its pod waits there; if "
                        "the drain evicts it before it starts, run the cell again"), sink.notices
    else:
        assert note.startswith(f"warning: {why} before the cell started; moved its pod to donor-"), sink.notices
        assert not note.endswith(node.removesuffix("-gpu")), note
