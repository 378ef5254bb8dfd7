"""Containers shut in as on a node, through the official client (root only: namespaces and users need it)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path

import kubernetes
import pytest
from gpu_offload.sandbox import fixtures, objectstore
from gpu_offload.sandbox.fixtures import wait_until
from gpu_offload.sandbox.kubelet import podnet
from gpu_offload.sandbox.liqo.origin import running_origin

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="pod namespaces and users need root and iproute2")
core, namespace = fixtures.core, fixtures.namespace
# the sandbox level's shared origin (tests/sandbox/conftest.py); pytest's folders, where its pods live, are private
# to root: a container of another user reaches only its own pod's files


def _pod(name: str, command: list[str], **spec) -> dict:
    return {"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [
                {"name": "main", "image": "python:3.11", "command": command}], **spec}}


def _running(core, namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase == "Running" and p,
                      f"pod {namespace}/{name} to run")


def _finished(core, namespace: str, name: str):
    return wait_until(lambda: (p := core.read_namespaced_pod(name, namespace)).status.phase
                      in ("Succeeded", "Failed") and p, f"pod {namespace}/{name} to finish")


def _log(core, namespace: str, name: str) -> str:
    return core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()


SERVE_NAME = ("import os, socket; s = socket.socket(); s.bind(('0.0.0.0', 8888)); s.listen()\n"
              "while True:\n c, _ = s.accept(); c.sendall(os.environ['HOSTNAME'].encode()); c.close()")


def _ask(ip: str, port: int = 8888) -> bytes:
    with socket.create_connection((ip, port), timeout=5) as conn:
        return conn.recv(100)


def test_two_pods_serving_the_same_port_each_answer_on_their_own_ip(core, namespace):
    for name in ("web-a", "web-b"):
        core.create_namespaced_pod(namespace, _pod(name, ["python3", "-c", SERVE_NAME]))
    ips = {name: _running(core, namespace, name).status.pod_ip for name in ("web-a", "web-b")}
    assert ips["web-a"] != ips["web-b"]
    for name, ip in ips.items():
        assert wait_until(lambda ip=ip: _try(ip), f"{name} to answer on {ip}:8888") == name.encode()


def _try(ip: str) -> bytes | None:
    try:
        return _ask(ip)
    except OSError:
        return None


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_a_child_that_ignores_sigterm_and_leaves_the_session_dies_with_its_pod(core):
    namespace, marker = f"t-{uuid.uuid4().hex[:10]}", f"stubborn-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    # the container ignores SIGTERM too: only the end of the grace period (SIGKILL) ends it
    code = ("import signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"subprocess.Popen(['sh', '-c', \"trap '' TERM; while true; do sleep 1; done # {marker}\"],"
            " start_new_session=True)\n"
            "print('started', flush=True); time.sleep(600)")
    core.create_namespaced_pod(namespace, _pod("parent", ["python3", "-c", code]))
    _running(core, namespace, "parent")
    wait_until(lambda: _processes_with(marker), "the stubborn child to start")
    core.delete_namespace(namespace)
    wait_until(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
               f"namespace {namespace} to be deleted", timeout=30)
    assert _processes_with(marker) == []


def test_run_as_user_and_group(core, namespace):
    pod = _pod("ids", ["sh", "-c", "id -u; id -g; id -G; stat -c %u /tmp/data; touch /tmp/data/mine"],
               securityContext={"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000})
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/tmp/data"}]
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "ids")
    assert done.status.phase == "Succeeded", (_log(core, namespace, "ids"), done.status.container_statuses)
    uid, gid, groups, owner = _log(core, namespace, "ids").split("\n")[:4]
    assert (uid, gid, set(groups.split()), owner) == ("1000", "3000", {"3000", "2000"}, "1000")


def test_container_level_user_wins_over_the_pod_level_one(core, namespace):
    pod = _pod("cid", ["python3", "-c", "import os; print(os.getuid())"], securityContext={"runAsUser": 1000})
    pod["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1001}
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "cid")
    assert done.status.phase == "Succeeded", (_log(core, namespace, "cid"), done.status.container_statuses)
    assert _log(core, namespace, "cid").strip() == "1001"


def _links_and_namespaces() -> str:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return links + subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_a_stopped_sandbox_leaves_no_network_behind(tmp_path, core):
    with running_origin(tmp_path, 1) as other:
        api = kubernetes.client.CoreV1Api(other.sandbox.api_client())
        api.create_namespaced_pod("default", _pod("p", ["sleep", "600"]))
        _running(api, "default", "p")
        index = other.kubelet.network.index
        assert f"gpobr{index}" in _links_and_namespaces() and f"gpo{index}-1" in _links_and_namespaces()
    assert f"gpobr{index}:" not in _links_and_namespaces() and f"gpo{index}-" not in _links_and_namespaces()


def test_leftovers_of_a_crashed_sandbox_are_removed_and_a_live_ones_kept(origin):
    dead = subprocess.Popen(["true"])
    dead.wait()
    index = next(i for i in range(254, 200, -1)
                 if subprocess.run(["ip", "link", "add", f"gpobr{i}", "type", "bridge"]).returncode == 0)
    subprocess.run(["ip", "link", "set", f"gpobr{index}", "alias", f"{podnet.ALIAS}{dead.pid}"], check=True)
    subprocess.run(["ip", "netns", "add", f"gpo{index}-1"], check=True)
    removed = podnet.remove_leftovers()
    assert {f"gpobr{index}", f"gpo{index}-1"} <= set(removed)
    assert f"gpobr{origin.kubelet.network.index}" not in removed
    assert f"gpobr{index}:" not in _links_and_namespaces()


ASK_BY_NAME = """
import socket, sys, time
for target in sys.argv[1:]:
    host, port = target.rsplit(':', 1)
    for attempt in range(200):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as conn:
                print(target, conn.recv(100).decode(), flush=True)
                break
        except OSError as exc:
            error = exc
            time.sleep(0.1)
    else:
        print(target, 'unreachable:', error, flush=True)
"""


def test_a_pod_reaches_a_service_by_its_names_and_a_headless_services_pod_by_hostname(core, namespace):
    core.create_namespaced_service(namespace, {"metadata": {"name": "crew"}, "spec": {
        "clusterIP": "None", "selector": {"app": "web"}, "ports": [{"port": 8888}]}})
    core.create_namespaced_service(namespace, {"metadata": {"name": "front"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8888}]}})
    core.create_namespaced_pod(namespace, _pod("web", ["python3", "-c", SERVE_NAME], hostname="web-0",
                                               subdomain="crew"))
    web_ip = _running(core, namespace, "web").status.pod_ip
    wait_until(lambda: _try(web_ip), "the web pod to serve")
    names = ["front:80", f"front.{namespace}:80", f"front.{namespace}.svc.cluster.local:80", "crew:8888",
             "web-0.crew:8888", f"web-0.crew.{namespace}.svc.cluster.local:8888"]
    core.create_namespaced_pod(namespace, _pod("client", ["python3", "-c", ASK_BY_NAME, *names]))
    done = _finished(core, namespace, "client")
    answers = dict(line.split(" ", 1) for line in _log(core, namespace, "client").splitlines())
    # the web pod answers with its HOSTNAME, which is its spec.hostname, as a container runtime sets it
    assert (done.status.phase, answers) == ("Succeeded", dict.fromkeys(names, "web-0"))


def test_a_program_that_cannot_be_run_is_a_start_error_not_a_running_container(core, namespace):
    core.create_namespaced_pod(namespace, _pod("missing", ["/no/such/program"]))
    done = _finished(core, namespace, "missing")
    state = done.status.container_statuses[0].state.terminated
    assert state is not None, done.status
    assert (done.status.phase, state.reason, state.exit_code) == ("Failed", "StartError", 128)
    assert "/no/such/program" in state.message and "No such file" in state.message


def test_a_host_network_pod_shares_the_hosts_network(core, namespace):
    with socket.socket() as listener:  # a port only the host's loopback has
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('reached')"
        core.create_namespaced_pod(namespace, _pod("host", ["python3", "-c", reach], hostNetwork=True))
        core.create_namespaced_pod(namespace, _pod("own", ["python3", "-c", reach]))
        host, own = _finished(core, namespace, "host"), _finished(core, namespace, "own")
    assert (host.status.phase, _log(core, namespace, "host").strip()) == ("Succeeded", "reached")
    assert host.status.pod_ip == host.status.host_ip
    assert own.status.phase == "Failed" and "Connection refused" in _log(core, namespace, "own")


def test_an_object_store_at_the_host_address_serves_this_process_and_the_pods(core, namespace, origin):
    # the host's 127.0.0.1 is out of a pod's reach: a store outside the cluster listens on the bridge
    with objectstore.s3_server(origin.host_address, ["shared"]) as endpoint:
        put = urllib.request.Request(f"{endpoint}/shared/greeting", data=b"hello from the host", method="PUT",
                                     headers={"x-amz-acl": "public-read",  # the pod reads it unsigned
                                              "Content-Type": "text/plain"})
        urllib.request.urlopen(put, timeout=10).close()
        fetch = f"import urllib.request; print(urllib.request.urlopen('{endpoint}/shared/greeting', timeout=5).read().decode())"
        core.create_namespaced_pod(namespace, _pod("reader", ["python3", "-c", fetch]))
        done = _finished(core, namespace, "reader")
    assert (done.status.phase, _log(core, namespace, "reader").strip()) == ("Succeeded", "hello from the host")


def test_a_pod_sees_its_own_folder_and_not_its_neighbours(core, namespace):
    core.create_namespaced_secret(namespace, {"metadata": {"name": "key"}, "stringData": {"token": "s3cr3t"}})
    neighbour = _pod("holder", ["sleep", "600"])
    neighbour["spec"]["containers"][0]["volumeMounts"] = [{"name": "key", "mountPath": "/etc/key"}]
    neighbour["spec"]["volumes"] = [{"name": "key", "secret": {"secretName": "key"}}]
    core.create_namespaced_pod(namespace, neighbour)
    _running(core, namespace, "holder")
    # the working directory is the pod's rootfs/, in <state>/pods/<pod>/: list the pods folder
    look = "import os; print(sorted(os.listdir(os.path.dirname(os.path.dirname(os.getcwd())))))"
    core.create_namespaced_pod(namespace, _pod("looker", ["python3", "-c", look]))
    done = _finished(core, namespace, "looker")
    seen = _log(core, namespace, "looker")
    assert done.status.phase == "Succeeded" and "looker" in seen and "holder" not in seen, seen


def test_a_pod_reaches_nothing_outside_the_sandbox_network(core, namespace):
    outside = next(a for a in _host_addresses() if not a.startswith(("127.", "10.")))
    code = (f"import socket\ntry:\n    socket.create_connection(('{outside}', 9), timeout=5)\n"
            "except OSError as exc:\n    print(exc.errno)")
    core.create_namespaced_pod(namespace, _pod("out", ["python3", "-c", code]))
    _finished(core, namespace, "out")
    assert _log(core, namespace, "out").strip() == str(errno.ENETUNREACH)


def _host_addresses() -> list[str]:
    listing = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in listing.splitlines()] + ["192.0.2.1", "8.8.8.8"]


def test_a_pod_is_named_by_its_hostname_which_resolves_to_its_ip(core, namespace):
    code = "import socket; name = socket.gethostname(); print(name, socket.gethostbyname(name))"
    core.create_namespaced_pod(namespace, _pod("rank", ["python3", "-c", code], hostname="worker-0", subdomain="ranks"))
    done = _finished(core, namespace, "rank")
    assert _log(core, namespace, "rank").split() == ["worker-0", done.status.pod_ip]


MOUNTED = """import os
d = os.path.join('/etc', os.environ['D'])  # built by the program: no path in its command line to rewrite
print(open(os.path.join(d, 'conf.py')).read(), open(os.path.join(d, 'secret', 'token')).read())
open(os.path.join(d, 'made'), 'w').write('mine')  # as a hub extracts its certificates next to its config
print(open(os.path.join(d, 'made')).read(), os.path.exists('/etc/passwd'), sorted(os.listdir(d)))
"""


def test_volumes_are_at_their_mount_paths_even_where_the_host_has_no_such_folder(core, namespace):
    # KubeSpawner's test hub: its config (a ConfigMap subPath) at /etc/jupyterhub/jupyterhub_config.py opens
    # /etc/jupyterhub/secret/... (a Secret) by a path it builds and writes beside them
    folder = f"gpo-test-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "conf"}, "data": {"conf.py": "c = 1"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "key"}, "stringData": {"token": "s3cr3t"}})
    pod = _pod("mounted", ["python3", "-c", MOUNTED])
    pod["spec"]["containers"][0]["env"] = [{"name": "D", "value": folder}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "conf", "mountPath": f"/etc/{folder}/conf.py", "subPath": "conf.py"},
        {"name": "key", "mountPath": f"/etc/{folder}/secret"}]
    pod["spec"]["volumes"] = [{"name": "conf", "configMap": {"name": "conf"}},
                              {"name": "key", "secret": {"secretName": "key"}}]
    core.create_namespaced_pod(namespace, pod)
    done = _finished(core, namespace, "mounted")
    log = _log(core, namespace, "mounted")
    assert done.status.phase == "Succeeded", (log, done.status.container_statuses)
    assert log.split("\n")[:2] == ["c = 1 s3cr3t", "mine True ['conf.py', 'made', 'secret']"], log
    assert not Path("/etc", folder).exists()  # made in the container's mount namespace, not on the host


def _mac(link: str) -> str:
    return Path(f"/sys/class/net/{link}/address").read_text().strip()


@pytest.mark.e2e  # it builds a bridge and pod namespaces
def test_the_gateway_keeps_its_mac_when_the_pod_holding_the_lowest_one_goes():
    """Pods cache the gateway's MAC; a bridge that takes its ports' lowest one changes it when that pod goes, and
    the other pods' new connections to the host (object store, API server) stall until their ARP entry expires:
    a moved session's first checkpoint upload took 35-68 s while its old pod was deleted."""
    network = podnet.PodNetwork(True)
    try:
        for uid in ("a", "b", "c"):
            network.attach(uid)
        bridge = f"gpobr{network.index}"
        before = _mac(bridge)
        veths = {uid: f"gv{network.index}-{name.split('-')[1]}" for uid, name in network._names.items()}
        lowest = min(veths, key=lambda uid: int(_mac(veths[uid]).replace(":", ""), 16))
        network.detach(lowest)
        assert _mac(bridge) == before
    finally:
        network.close()
