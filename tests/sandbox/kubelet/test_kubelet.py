"""The test kubelet through the official client: what a container gets, how it lives, how it ends."""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kubelet import process
from kubernetes.stream import stream

core, namespace = fixtures.core, fixtures.namespace



def _pod(name: str, code: str, image: str = "python:3.11", restart: str = "Never", **container) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "demo"}},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "main", "image": image, "command": ["python3", "-u", "-c", code], **container}]}}


def _finished(core, namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase in ("Succeeded", "Failed")
                      and p, f"pod {namespace}/{name} to finish")


def _log(core, namespace: str, name: str) -> str:
    return core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()


def test_env_volumes_downward_api_and_working_dir(core, namespace):
    core.create_namespaced_secret(namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cr3t"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    code = ("import os, json; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), "
            "'token': open('/etc/creds/token'.replace('/etc/creds', os.environ['CREDS'])).read(), "
            "'mode': open(os.environ['CONF'] + '/mode').read()}))")
    pod = _pod("env", code, workingDir="/work/here",
               env=[{"name": "CREDS", "value": "/etc/creds"}, {"name": "CONF", "value": "/etc/conf"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}],
               envFrom=[{"configMapRef": {"name": "settings"}, "prefix": "CM_"}],
               volumeMounts=[{"name": "creds", "mountPath": "/etc/creds"}, {"name": "conf", "mountPath": "/etc/conf"}])
    pod["spec"]["volumes"] = [{"name": "creds", "secret": {"secretName": "creds"}},
                              {"name": "conf", "configMap": {"name": "settings"}}]
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "env")
    assert done.status.phase == "Succeeded", _log(core, namespace, "env")
    out = json.loads(_log(core, namespace, "env"))
    env = out["env"]
    assert sorted(env) == ["CM_mode", "CONF", "CREDS", "HOME", "HOST", "HOSTNAME", "IP", "LANG", "ME", "NODE",
                           "PATH", "SA", "TOKEN"]
    assert (env["TOKEN"], env["CM_mode"], env["ME"], env["SA"], env["HOSTNAME"]) == ("s3cr3t", "fast", "env",
                                                                                      "default", "env")
    assert env["IP"] == done.status.pod_ip
    assert env["HOST"] == done.status.host_ip and env["NODE"] == done.spec.node_name
    assert (out["token"], out["mode"]) == ("s3cr3t", "fast")
    assert env["CREDS"].endswith("/rootfs/etc/creds") and out["cwd"].endswith("/rootfs/work/here")


def test_each_pod_gets_its_own_ip(core, namespace):
    for name in ("a", "b"):
        core.create_namespaced_pod(namespace, _pod(name, "print('x')"))
    ips = {_finished(core, namespace, n).status.pod_ip for n in ("a", "b")}
    assert len(ips) == 2


def test_exit_code_phase_and_container_state(core, namespace):
    core.create_namespaced_pod(namespace, _pod("fails", "import sys; print('bye'); sys.exit(3)"))
    pod = _finished(core, namespace, "fails")
    state = pod.status.container_statuses[0].state.terminated
    assert (pod.status.phase, state.exit_code, state.reason) == ("Failed", 3, "Error")
    assert _log(core, namespace, "fails") == "bye\n"


def test_on_failure_restarts_until_success(core, namespace):
    code = ("import os, sys; m = '/scratch/ran'\n"
            "m = m.replace('/scratch', os.environ['S'])\n"
            "first = not os.path.exists(m); open(m, 'w').close(); print('first' if first else 'again')\n"
            "sys.exit(1 if first else 0)")
    pod = _pod("retry", code, restart="OnFailure", env=[{"name": "S", "value": "/scratch"}],
               volumeMounts=[{"name": "s", "mountPath": "/scratch"}])
    pod["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "retry")
    status = done.status.container_statuses[0]
    assert done.status.phase == "Succeeded"
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert _log(core, namespace, "retry") == "first\nagain\n"


def test_active_deadline_fails_the_pod_with_deadline_exceeded(core, namespace):
    pod = _pod("slow", "import time; time.sleep(600)")
    pod["spec"]["activeDeadlineSeconds"] = 1
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "slow")
    assert (done.status.phase, done.status.reason) == ("Failed", "DeadlineExceeded")
    assert done.status.container_statuses[0].state.terminated is not None


def test_unknown_image_goes_image_pull_backoff(core, namespace):
    core.create_namespaced_pod(namespace, _pod("nope", "print(1)", image="registry.invalid/team/private:1"))
    waiting = wait_until(lambda: (s := core.read_namespaced_pod("nope", namespace).status.container_statuses)
                         and s[0].state.waiting and s[0].state.waiting.reason == "ImagePullBackOff" and s[0],
                         "ImagePullBackOff")
    assert "registry.invalid/team/private:1" in waiting.state.waiting.message
    assert core.read_namespaced_pod("nope", namespace).status.phase == "Pending"


def test_stock_image_lacks_gpu_offload_and_project_image_has_it(core, namespace):
    code = "import numpy\ntry:\n import gpu_offload; print('has')\nexcept ImportError: print('lacks')"
    core.create_namespaced_pod(namespace, _pod("stock", code, image="python:3.11-slim"))
    core.create_namespaced_pod(namespace, _pod("proj", code, image="example.org/jupyter-gpu-offload:0.1.0"))
    for name, expected in (("stock", "lacks\n"), ("proj", "has\n")):
        assert _finished(core, namespace, name).status.phase == "Succeeded"
        assert _log(core, namespace, name) == expected


def test_missing_secret_volume_waits_then_runs(core, namespace):
    pod = _pod("later", "print(open(__import__('os').environ['F']).read())",
               env=[{"name": "F", "value": "/b/k"}], volumeMounts=[{"name": "b", "mountPath": "/b"}])
    pod["spec"]["volumes"] = [{"name": "b", "secret": {"secretName": "late"}}]
    core.create_namespaced_pod(namespace, pod)
    wait_until(lambda: any(e.reason == "FailedMount" for e in core.list_namespaced_event(namespace).items), "FailedMount")
    assert core.read_namespaced_pod("later", namespace).status.phase == "Pending"
    core.create_namespaced_secret(namespace, {"metadata": {"name": "late"}, "stringData": {"k": "arrived"}})
    assert _finished(core, namespace, "later").status.phase == "Succeeded"
    assert _log(core, namespace, "later") == "arrived\n"


def test_log_follow_streams_while_the_container_runs(core, namespace):
    code = "import sys\nfor line in sys.stdin: print('got', line.strip(), flush=True)"
    core.create_namespaced_pod(namespace, _pod("echo", code, stdin=True, stdinOnce=True))
    wait_until(lambda: core.read_namespaced_pod("echo", namespace).status.phase == "Running", "Running")
    resp = core.read_namespaced_pod_log("echo", namespace, follow=True, _preload_content=False)
    attach = stream(core.connect_get_namespaced_pod_attach, "echo", namespace, container="main", stdin=True,
                    stdout=True, stderr=True, tty=False, _preload_content=False)
    attach.write_stdin("hello\n")
    first = resp.readline() if hasattr(resp, "readline") else next(resp.stream(16))
    assert first.startswith(b"got hello")
    attach.write_stdin("world\n")
    seen = b""
    while b"got world" not in seen:
        attach.update(timeout=5)
        seen += attach.read_stdout().encode() if attach.peek_stdout() else b""
    attach.close()
    # closed, not released: the follow stream is still open and the kubelet may still write to it (the "got
    # world" chunk under load); a connection given back to the pool then feeds those bytes to the next request
    resp.close()


def test_exec_runs_in_the_container_environment(core, namespace):
    core.create_namespaced_pod(namespace, _pod("svc", "import time; time.sleep(600)",
                                        env=[{"name": "GREETING", "value": "hi"}]))
    wait_until(lambda: core.read_namespaced_pod("svc", namespace).status.phase == "Running", "Running")
    out = stream(core.connect_get_namespaced_pod_exec, "svc", namespace, command=[
        "python3", "-c", "import os; print(os.environ['GREETING'], os.environ['HOSTNAME'])"],
        stdout=True, stderr=True, stdin=False, tty=False)
    assert out == "hi svc\n"


def test_delete_sends_sigterm_then_sigkill_after_grace_and_nothing_survives(core, namespace):
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('got TERM, ignoring', flush=True))\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(0.05)")
    core.create_namespaced_pod(namespace, _pod("stubborn", code))
    pod = wait_until(lambda: (p := core.read_namespaced_pod("stubborn", namespace)).status.phase == "Running" and p,
                     "Running")
    pid = int(pod.status.container_statuses[0].container_id.rsplit("/", 1)[1])
    resp = core.read_namespaced_pod_log("stubborn", namespace, follow=True, _preload_content=False)
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(resp.stream(1)), daemon=True)
    reader.start()
    # Running means the program was started, not that it has set its handler yet: it says when it has
    wait_until(lambda: b"ready" in b"".join(lines), "the program to handle SIGTERM")
    core.delete_namespaced_pod("stubborn", namespace)  # terminationGracePeriodSeconds: 1
    wait_until(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=stubborn").items,
               "the pod to be gone")
    reader.join(timeout=30)
    assert b"got TERM, ignoring" in b"".join(lines)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_init_containers_run_first_in_order_and_a_failing_one_fails_the_pod(core, namespace):
    pod = _pod("init", "import os; print(open(os.environ['S'] + '/order').read())",
               env=[{"name": "S", "value": "/shared"}], volumeMounts=[{"name": "s", "mountPath": "/shared"}])
    step = "import os; open(os.environ['S'] + '/order', 'a').write('{}')"
    pod["spec"]["initContainers"] = [
        {"name": f"init-{i}", "image": "python:3.11", "command": ["python3", "-c", step.format(i)],
         "env": [{"name": "S", "value": "/shared"}], "volumeMounts": [{"name": "s", "mountPath": "/shared"}]}
        for i in (1, 2)]
    pod["spec"]["volumes"] = [{"name": "s", "emptyDir": {}}]
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "init")
    assert done.status.phase == "Succeeded"
    assert [s.state.terminated.reason for s in done.status.init_container_statuses] == ["Completed", "Completed"]
    assert _log(core, namespace, "init") == "12\n"
    bad = _pod("bad-init", "print('never')")
    bad["spec"]["initContainers"] = [{"name": "check", "image": "python:3.11",
                                      "command": ["python3", "-c", "raise SystemExit(2)"]}]
    core.create_namespaced_pod(namespace, bad)
    failed = _finished(core, namespace, "bad-init")
    assert failed.status.phase == "Failed"
    assert failed.status.init_container_statuses[0].state.terminated.exit_code == 2
    assert failed.status.container_statuses[0].state.waiting.reason == "PodInitializing"


def test_exceeding_the_memory_limit_is_oom_killed(core, namespace):
    code = "import time\nblob = bytearray(300 * 1024 * 1024)\nfor i in range(0, len(blob), 4096): blob[i] = 1\ntime.sleep(600)"
    core.create_namespaced_pod(namespace, _pod("greedy", code, resources={"limits": {"memory": "128Mi"}}))
    done = _finished(core, namespace, "greedy")
    state = done.status.container_statuses[0].state.terminated
    assert (done.status.phase, state.reason, state.exit_code) == ("Failed", "OOMKilled", 137)


def test_unsupported_volume_is_a_config_error_and_starts_nothing(core, namespace):
    pod = _pod("hostpath", "print('never')", volumeMounts=[{"name": "h", "mountPath": "/host"}])
    pod["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/etc"}}]
    core.create_namespaced_pod(namespace, pod)
    status = wait_until(lambda: (s := core.read_namespaced_pod("hostpath", namespace).status.container_statuses)
                        and s[0].state.waiting and s[0].state.waiting.reason == "CreateContainerConfigError"
                        and s[0], "CreateContainerConfigError")
    assert "use secret, configMap or emptyDir volumes" in status.state.waiting.message
    assert status.container_id is None and core.read_namespaced_pod("hostpath", namespace).status.phase == "Pending"


def test_restart_policy_always_restarts_with_crash_loop_backoff(core, namespace):
    core.create_namespaced_pod(namespace, _pod("crash", "raise SystemExit(1)", restart="Always"))
    status = wait_until(lambda: (s := core.read_namespaced_pod("crash", namespace).status.container_statuses)
                        and s[0].restart_count >= 2 and s[0].state.waiting and s[0], "two restarts")
    assert status.state.waiting.reason == "CrashLoopBackOff"
    assert status.last_state.terminated.exit_code == 1
    assert core.read_namespaced_pod("crash", namespace).status.phase == "Running"


def test_deleting_a_pod_also_ends_what_its_container_started(core, namespace):
    pod = _pod("forker", "")
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", "sleep 300 & sleep 300"]
    core.create_namespaced_pod(namespace, pod)
    running = wait_until(lambda: (p := core.read_namespaced_pod("forker", namespace)).status.phase == "Running"
                         and p, "Running")
    session = int(running.status.container_statuses[0].container_id.rsplit("/", 1)[1])
    wait_until(lambda: len(process.session_members(session)) >= 3, "sh and both sleeps")
    core.delete_namespaced_pod("forker", namespace)
    wait_until(lambda: not core.list_namespaced_pod(namespace, field_selector="metadata.name=forker").items, "gone")
    wait_until(lambda: not process.session_members(session), "every process of the pod to end")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def test_an_exec_session_ends_with_its_pod(core, namespace):
    core.create_namespaced_pod(namespace, _pod("host", "import time; time.sleep(600)"))
    wait_until(lambda: core.read_namespaced_pod("host", namespace).status.phase == "Running", "Running")
    # found by its command line: a pid printed inside a container is its PID namespace's, as on a node
    marker = f"exec-{uuid.uuid4().hex[:8]}"
    session = stream(core.connect_get_namespaced_pod_exec, "host", namespace, command=[
        "python3", "-c", f"import time; print('{marker}', flush=True); time.sleep(600)"],
        stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    out = ""
    while not out.strip():
        session.update(timeout=5)
        out += session.read_stdout() if session.peek_stdout() else ""
    exec_pids = [pid for pid in process.live_processes() if marker.encode() in _cmdline(pid)]
    assert exec_pids
    core.delete_namespaced_pod("host", namespace)
    wait_until(lambda: not any(marker.encode() in _cmdline(pid) for pid in exec_pids),
               "the exec'd process to end with the pod")
    session.close()


def test_a_slow_pull_writes_a_kubelets_pulling_and_pulled_events_once_per_node(origin, core, namespace):
    """The ``slow-pull`` fault: the first container of the image on a node waits for its pull, with the events a
    kubelet's image manager writes (the kernel reads them to say a cell's pod is pulling); later ones find it
    present."""
    from gpu_offload.engine.backends.kube.image_pull import pulled, pulling_image

    origin.faults.slow_pull("python:3.11", 1.5, 4321)
    try:
        first = _finished(core, namespace, core.create_namespaced_pod(namespace, _pod("p1", "print(1)")).metadata.name)
        second = core.create_namespaced_pod(namespace, {**_pod("p2", "print(2)"), "spec": {
            **_pod("p2", "print(2)")["spec"], "nodeName": first.spec.node_name}})
        _finished(core, namespace, second.metadata.name)
    finally:
        origin.faults.clear()
    events = {name: [(e.reason, e.message) for e in sorted(core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}").items, key=lambda e: e.metadata.creation_timestamp)
        if e.reason in ("Pulling", "Pulled")] for name in ("p1", "p2")}
    (pulling, start), (done, end) = events["p1"]
    assert (pulling, done) == ("Pulling", "Pulled") and start == 'Pulling image "python:3.11"'
    assert pulling_image(start) == "python:3.11"
    found = pulled(end)
    assert found is not None and found.image == "python:3.11" and found.size == 4321 and 1.5 <= found.seconds < 10, end
    assert events["p2"] == [("Pulled", 'Container image "python:3.11" already present on machine')]
