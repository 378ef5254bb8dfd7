"""``--session`` on kubernetes: one warm pod keeps its state across cells received through attach; Ctrl-C
interrupts the cell, not the session; closing it deletes the pod."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import RemoteError

from .conftest import leftovers, settings
from .helpers import Sink, run_cell


def test_a_session_pod_keeps_state_survives_an_interrupt_and_goes_on_close(kube: KubernetesBackend, core: Any,
                                                                           namespace: str) -> None:
    user_ns: dict[str, Any] = {}
    outcome, _, _ = run_cell(kube, "kept = 41\nprint('first')", user_ns, session="train")
    assert outcome.status == "ok", outcome.error
    pods = core.list_namespaced_pod(namespace).items
    assert len(pods) == 1 and pods[0].spec.automount_service_account_token is False
    assert pods[0].spec.containers[0].stdin is True

    def interrupt(text: str) -> None:
        if "waiting" in text:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_cell(kube, "import time\nprint('waiting', flush=True)\ntime.sleep(300)", user_ns,
                 Sink(on_line=interrupt), session="train")
    outcome, sink, _ = run_cell(kube, "print(kept + 1)", user_ns, session="train")
    assert outcome.status == "ok", outcome.error
    assert sink.text.strip() == "42"
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == [pods[0].metadata.name]
    [info] = kube.sessions()
    assert (info.name, info.runs, info.busy) == ("train", 3, False) and "donor-2" in info.where
    assert kube.close_session("train", grace=1)
    wait_until(lambda: not leftovers(core, namespace), "the session pod and its Secret deleted")


def test_a_session_pod_lost_while_idle_is_replaced_and_the_user_told(kube: KubernetesBackend, core: Any,
                                                                     namespace: str) -> None:
    outcome, _, _ = run_cell(kube, "kept = 1", {}, session="fragile")
    assert outcome.status == "ok", outcome.error
    [old] = core.list_namespaced_pod(namespace).items
    core.delete_namespaced_pod(old.metadata.name, namespace, grace_period_seconds=0)  # e.g. an admin, a drain
    wait_until(lambda: not kube.sessions(), "the session seen as ended")
    outcome, sink, _ = run_cell(kube, "print(kept)", {}, session="fragile")
    assert any(f"its pod {old.metadata.name} ended while idle" in n for n in sink.notices), sink.notices
    assert outcome.error is not None and "kept" in str(outcome.error)  # a fresh namespace: NameError
    assert kube.close_session("fragile", grace=1)
    wait_until(lambda: not leftovers(core, namespace), "the new session pod deleted")


def test_a_session_pod_stays_in_step_after_a_975_level_display_and_an_abandoned_cell(
        kube: KubernetesBackend, core: Any, namespace: str) -> None:
    deep = ("nested = []\nfor _ in range(975):\n    nested = [nested]\n"
            "display({'application/json': {'a': nested}, 'text/plain': 'deep'}, raw=True)\nprint('deep done')\n")
    outcome, sink, _ = run_cell(kube, deep, {}, session="step")
    assert outcome.status == "ok" and "deep done" in sink.text, outcome.error
    assert any("nested deeper than 100" in n for n in sink.notices), sink.notices

    def give_up(text: str) -> None:  # the front end fails while the cell still runs
        if "one-a" in text:
            raise OSError("the notebook went away")

    with pytest.raises(OSError):
        run_cell(kube, "import time\nprint('one-a', flush=True)\ntime.sleep(1)\nprint('one-b')\n", {},
                 Sink(on_line=give_up), session="step")
    user_ns: dict[str, Any] = {}
    for k in (2, 3, 4):
        outcome, sink, _ = run_cell(kube, f"print('cell {k}')\nv{k} = {k}\n", user_ns, session="step")
        assert outcome.status == "ok", outcome.error
        assert sink.text == f"cell {k}\n" and user_ns[f"v{k}"] == k, (sink.text, sink.notices)
    assert kube.close_session("step", grace=1)
    wait_until(lambda: not leftovers(core, namespace), "the session pod and its Secret deleted")


def test_every_cell_of_a_session_says_where_its_pod_runs(kube: KubernetesBackend, core: Any, namespace: str) -> None:
    notices = []
    for cell in ("n = 1", "n += 1"):
        outcome, sink, _ = run_cell(kube, cell, {}, session="where")
        assert outcome.status == "ok", outcome.error
        # a pod slower to start than the engine's first progress note (a loaded machine, a real cluster) adds
        # "no output yet", a passing progress line; the placement line is said by every cell, and nothing else
        notices.append([n for n in sink.notices if not n.startswith("no output yet after ")])
    [pod] = core.list_namespaced_pod(namespace).items
    said = f"running in pod {pod.metadata.name} on virtual node donor-2-gpu (Liqo cluster donor-2, 1 x L4)"
    assert notices == [[said], [f"{said}, session where"]]
    assert kube.close_session("where", grace=1)
    wait_until(lambda: not leftovers(core, namespace), "the session pod deleted")


def test_an_idle_session_past_the_idle_timeout_is_ended_and_the_notebook_told(api_client: Any, core: Any,
                                                                              namespace: str) -> None:
    # the chart's offload.sessionIdleTimeout, as the spawner hands it to the kernel
    backend = KubernetesBackend(settings(namespace, session_idle_timeout=1.0), api_client)
    try:
        outcome, _, _ = run_cell(backend, "kept = 41", {}, session="forgotten")
        assert outcome.status == "ok", outcome.error
        wait_until(lambda: not backend.sessions(), "the idle session ended by its kernel")
        wait_until(lambda: not leftovers(core, namespace), "its pod and Secret deleted: the GPU is free")
        status = backend.describe()
        assert "session forgotten: its pod" in status and "was ended after 1 s idle holding 1 GPU" in status, status
        assert "offload.sessionIdleTimeout" in status and "its variables are gone" in status

        outcome, sink, _ = run_cell(backend, "print(kept + 1)", {}, session="forgotten")
        notices = " ".join(sink.notices)
        assert "session forgotten: its pod" in notices and "was ended after 1 s idle" in notices, notices
        assert "variables of the old one are gone" in notices
        assert isinstance(outcome.error, RemoteError) and outcome.error.ename == "NameError", outcome.error
        assert "session forgotten" not in backend.describe()  # said once, at that session's next cell
    finally:
        backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind")
