"""The test kubelet's probes and restarts through the official client: readiness keeps a pod out of Ready
until its check passes, liveness restarts a container, a container that cannot start is retried."""

from __future__ import annotations

import socket

from gpu_offload.sandbox import fixtures
from gpu_offload.sandbox.fixtures import wait_until
from kubernetes import watch
from kubernetes.stream import stream

core, namespace = fixtures.core, fixtures.namespace

# Serves on PORT once a file named "go" exists in the working directory; before that nothing listens.
SERVE_WHEN_GO = """
import http.server, os, sys, time
while not os.path.exists('go'):
    time.sleep(0.05)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if os.path.exists('healthy') else 503); self.end_headers()
http.server.HTTPServer(('0.0.0.0', int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pod(name: str, probes: dict, port: int, restart: str = "Always") -> dict:
    return {"metadata": {"name": name}, "spec": {
        "restartPolicy": restart, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "python:3.12", "command": ["python3", "-u", "-c", SERVE_WHEN_GO,
                                                                               str(port)],
                        "ports": [{"name": "web", "containerPort": port}], **probes}]}}


def _touch(core, namespace: str, name: str, filename: str) -> None:
    wait_until(lambda: (s := core.read_namespaced_pod(name, namespace).status.container_statuses)
               and s[0].state.running, f"{name} running")
    stream(core.connect_get_namespaced_pod_exec, name, namespace,
           command=["python3", "-c", f"open({filename!r}, 'w').close()"], stdout=True, stderr=True, stdin=False,
           tty=False)


def _unhealthy(core, namespace: str, name: str, kind: str) -> list:
    return [e for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == name and e.reason == "Unhealthy" and e.message.startswith(kind)]


def _status(core, namespace: str, name: str):
    statuses = core.read_namespaced_pod(name, namespace).status.container_statuses
    return statuses[0] if statuses else None


def _ready(pod) -> tuple[bool, str]:
    cond = next(c for c in pod.status.conditions if c.type == "Ready")
    return pod.status.container_statuses[0].ready, cond.status


def test_readiness_probe_keeps_the_pod_unready_until_its_port_opens(core, namespace):
    probe = {"tcpSocket": {"port": "web"}, "periodSeconds": 1, "failureThreshold": 1}
    core.create_namespaced_pod(namespace, _pod("tcp", {"readinessProbe": probe}, _free_port()))
    [event] = wait_until(lambda: _unhealthy(core, namespace, "tcp", "Readiness probe failed: dial tcp"),
                         "a failed probe")
    assert event.message.endswith("connect: connection refused")
    # the same failure again is counted on the first event, as client-go's correlator does, not repeated
    again = wait_until(lambda: (e := _unhealthy(core, namespace, "tcp", "Readiness")) and e[0].count >= 2 and e,
                       "a second failure")
    assert len(again) == 1 and again[0].last_timestamp >= again[0].first_timestamp
    pod = core.read_namespaced_pod("tcp", namespace)
    assert pod.status.phase == "Running" and pod.status.container_statuses[0].state.running
    assert _ready(pod) == (False, "False")
    assert "containers with unready status: [main]" in next(
        c.message for c in pod.status.conditions if c.type == "Ready")
    _touch(core, namespace, "tcp", "go")
    wait_until(lambda: _ready(core.read_namespaced_pod("tcp", namespace)) == (True, "True"), "Ready")


def test_http_readiness_counts_an_error_status_as_unready(core, namespace):
    port = _free_port()
    probe = {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 1, "failureThreshold": 1}
    core.create_namespaced_pod(namespace, _pod("http", {"readinessProbe": probe}, port))
    _touch(core, namespace, "http", "go")
    wait_until(lambda: any("statuscode: 503" in e.message for e in _unhealthy(core, namespace, "http", "Readiness")),
               "a probe answered 503")
    assert _ready(core.read_namespaced_pod("http", namespace)) == (False, "False")
    _touch(core, namespace, "http", "healthy")
    wait_until(lambda: _ready(core.read_namespaced_pod("http", namespace)) == (True, "True"), "Ready")


def test_failing_liveness_probe_restarts_the_container(core, namespace):
    check = "import os, sys; sick = os.path.exists('sick'); print('still sick' if sick else 'fine'); sys.exit(sick)"
    live = {"exec": {"command": ["python3", "-c", check]}, "periodSeconds": 1, "failureThreshold": 2}
    core.create_namespaced_pod(namespace, _pod("live", {"livenessProbe": live}, _free_port()))
    wait_until(lambda: core.read_namespaced_pod("live", namespace).status.phase == "Running", "Running")
    assert core.read_namespaced_pod("live", namespace).status.container_statuses[0].restart_count == 0
    _touch(core, namespace, "live", "sick")
    status = wait_until(lambda: (s := _status(core, namespace, "live")) and s.restart_count >= 1 and s, "a restart")
    assert status.last_state.terminated is not None
    reasons = {e.reason for e in core.list_namespaced_event(namespace).items if e.involved_object.name == "live"}
    assert {"Unhealthy", "Killing"} <= reasons
    assert _unhealthy(core, namespace, "live", "Liveness")[0].message == "Liveness probe failed: still sick\n"


def test_startup_probe_holds_back_started_ready_and_liveness(core, namespace):
    exists = "import os, sys; sys.exit(not os.path.exists('up'))"
    probes = {"startupProbe": {"exec": {"command": ["python3", "-c", exists]}, "periodSeconds": 1,
                               "failureThreshold": 1000},
              "livenessProbe": {"exec": {"command": ["python3", "-c", "raise SystemExit(0)"]}, "periodSeconds": 1}}
    core.create_namespaced_pod(namespace, _pod("slow", probes, _free_port()))
    wait_until(lambda: _unhealthy(core, namespace, "slow", "Startup probe failed"), "a failed startup probe")
    status = core.read_namespaced_pod("slow", namespace).status.container_statuses[0]
    assert status.state.running and (status.started, status.ready) == (False, False)
    _touch(core, namespace, "slow", "up")
    status = wait_until(lambda: (s := _status(core, namespace, "slow")) and s.ready and s, "started and ready")
    assert status.started and status.restart_count == 0


def test_failing_startup_probe_restarts_the_container(core, namespace):
    probes = {"startupProbe": {"exec": {"command": ["python3", "-c", "raise SystemExit(1)"]}, "periodSeconds": 1,
                               "failureThreshold": 2}}
    core.create_namespaced_pod(namespace, _pod("never", probes, _free_port()))
    wait_until(lambda: (s := _status(core, namespace, "never")) and s.restart_count >= 1, "a restart")
    killing = [e.message for e in core.list_namespaced_event(namespace).items if e.reason == "Killing"]
    assert killing == ["Container main failed startup probe, will be restarted"]


def test_start_error_is_retried_with_growing_back_off(core, namespace):
    pod = _pod("nobin", {}, 0)
    pod["spec"]["containers"][0]["command"] = ["no-such-binary-here"]
    delays: list[str] = []
    counts: list[int] = []
    w = watch.Watch()
    core.create_namespaced_pod(namespace, pod)
    for event in w.stream(core.list_namespaced_pod, namespace, field_selector="metadata.name=nobin",
                          timeout_seconds=60):
        status = (event["object"].status.container_statuses or [None])[0]
        waiting = status and status.state.waiting
        if waiting and waiting.reason == "CrashLoopBackOff":
            delay = waiting.message.split()[1]
            if delay not in delays:
                delays.append(delay)
                counts.append(status.restart_count)
            assert status.last_state.terminated.reason == "StartError"
            assert status.last_state.terminated.exit_code == 128
            assert "executable file not found" in status.last_state.terminated.message
        if len(delays) >= 3:
            w.stop()
    assert delays[:3] == ["0.5s", "1s", "2s"]  # the origin fixture's base back-off is 0.5 s
    assert counts[:3] == [2, 3, 4]  # the first restart came at once, as a kubelet's does
    status = core.read_namespaced_pod("nobin", namespace).status
    assert status.container_statuses[0].restart_count >= 3 and status.phase == "Running"
