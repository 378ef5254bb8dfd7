"""Other clients the project depends on, unchanged: discovery documents, kubernetes_asyncio (what
kubespawner uses), and kubectl when the machine has it (`--validate=false`: no OpenAPI documents)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.request

import pytest


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def test_discovery_documents(api_sandbox):
    base = api_sandbox.url
    assert _get(f"{base}/version")["gitVersion"].startswith("v1.36")
    assert _get(f"{base}/api")["versions"] == ["v1"]
    groups = {g["name"]: g for g in _get(f"{base}/apis")["groups"]}
    assert {"batch", "events.k8s.io", "offloading.liqo.io", "authentication.liqo.io"} <= set(groups)
    assert groups["offloading.liqo.io"]["preferredVersion"]["version"] == "v1beta1"
    core = {r["name"]: r for r in _get(f"{base}/api/v1")["resources"]}
    assert {"pods/log", "pods/exec", "pods/attach", "pods/status", "nodes/status"} <= set(core)
    assert core["pods"]["namespaced"] and not core["nodes"]["namespaced"]
    vn = {r["name"]: r for r in _get(f"{base}/apis/offloading.liqo.io/v1beta1")["resources"]}["virtualnodes"]
    assert vn["kind"] == "VirtualNode" and "watch" in vn["verbs"]


def test_kubernetes_asyncio_lists_and_watches(api_sandbox, core, ns):
    from kubernetes_asyncio import client, config, watch

    async def run() -> list[tuple[str, str]]:
        await config.load_kube_config(config_file=str(api_sandbox.kubeconfig))
        async with client.ApiClient() as api:
            v1 = client.CoreV1Api(api)
            await v1.create_namespaced_config_map(ns, {"metadata": {"name": "async"}})
            listed = await v1.list_namespaced_config_map(ns)
            rv = listed.metadata.resource_version
            await v1.patch_namespaced_config_map("async", ns, {"data": {"k": "v"}})
            events = []
            async with watch.Watch().stream(v1.list_namespaced_config_map, ns, resource_version=rv,
                                            timeout_seconds=1) as stream:
                async for ev in stream:
                    events.append((ev["type"], ev["object"].metadata.name))
            return events

    assert asyncio.run(run()) == [("MODIFIED", "async")]
    assert core.read_namespaced_config_map("async", ns).data == {"k": "v"}


kubectl_missing = pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl on this machine")


def kubectl(sandbox, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", str(sandbox.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


@kubectl_missing
def test_kubectl_create_get_label_patch_delete(api_sandbox, ns):
    manifest = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "w"}},
                           "spec": {"containers": [{"name": "main", "image": "python:3.12"}]}})
    assert kubectl(api_sandbox, "-n", ns, "create", "--validate=false", "-f", "-", stdin=manifest).returncode == 0
    again = kubectl(api_sandbox, "-n", ns, "create", "--validate=false", "-f", "-", stdin=manifest)
    assert again.returncode != 0 and "AlreadyExists" in again.stderr
    assert kubectl(api_sandbox, "-n", ns, "label", "pod", "web", "tier=gpu").returncode == 0
    names = kubectl(api_sandbox, "-n", ns, "get", "pods", "-l", "tier in (gpu),app=w", "-o", "name").stdout
    assert names.split() == ["pod/web"]
    patched = kubectl(api_sandbox, "-n", ns, "patch", "pod", "web", "--type=json",
                      "-p", '[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]')
    assert patched.returncode == 0, patched.stderr
    got = json.loads(kubectl(api_sandbox, "-n", ns, "get", "pod", "web", "-o", "json").stdout)
    assert got["metadata"]["annotations"] == {"a": "b"} and got["status"]["phase"] == "Pending"
    gone = kubectl(api_sandbox, "-n", ns, "delete", "pod", "web", "--timeout=60s")
    assert gone.returncode == 0, gone.stderr
    missing = kubectl(api_sandbox, "-n", ns, "get", "pod", "web")
    assert missing.returncode != 0 and "NotFound" in missing.stderr


@kubectl_missing
def test_kubectl_logs_and_exec(api_sandbox, core, ns, pod):
    node = f"kubectl-{ns}"

    async def provider(req, io):
        await io.write_stdout(("ran " + " ".join(req.command) + "\n").encode())
        return 0

    api_sandbox.api.streams.register(provider, node=node)
    try:
        core.create_namespaced_pod(ns, pod("p", nodeName=node))
        core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running"}})
        api_sandbox.api.logs.write(ns, "p", "main", "hello from the pod\n")
        api_sandbox.api.logs.close(ns, "p", "main")
        logs = kubectl(api_sandbox, "-n", ns, "logs", "p", "-f")
        assert logs.stdout == "hello from the pod\n", logs.stderr
        out = kubectl(api_sandbox, "-n", ns, "exec", "p", "--", "echo", "hi")
        assert out.stdout == "ran echo hi\n", out.stderr
    finally:
        api_sandbox.api.streams.unregister(node)


def test_table_printing_for_kubectl(api_sandbox, core, ns, pod):
    core.create_namespaced_pod(ns, pod("p"))
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running", "containerStatuses": [
        {"name": "main", "image": "python:3.12", "imageID": "", "ready": True, "restartCount": 2,
         "state": {"running": {"startedAt": "2026-11-22T01:00:00Z"}}}]}})
    req = urllib.request.Request(f"{api_sandbox.url}/api/v1/namespaces/{ns}/pods",
                                 headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        printed = json.loads(resp.read())
    assert printed["kind"] == "Table"
    assert [c["name"] for c in printed["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert printed["rows"][0]["cells"][:4] == ["p", "1/1", "Running", 2]
    if shutil.which("kubectl"):
        out = kubectl(api_sandbox, "-n", ns, "get", "pods").stdout.split()
        assert out[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"] and out[5:9] == ["p", "1/1", "Running", "2"]


@kubectl_missing
def test_kubectl_create_and_apply_with_default_validation(api_sandbox, ns):
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"k": "v"}}
    done = kubectl(api_sandbox, "-n", ns, "create", "-f", "-", stdin=json.dumps(good))
    assert done.returncode == 0, done.stderr  # kubectl left validation to the server (fieldValidation)
    good["data"]["k2"] = "v2"
    applied = kubectl(api_sandbox, "-n", ns, "apply", "-f", "-", stdin=json.dumps(good))
    assert applied.returncode == 0, applied.stderr
    bad = {**good, "metadata": {"name": "bad"}, "bogus": 1}
    refused = kubectl(api_sandbox, "-n", ns, "create", "-f", "-", stdin=json.dumps(bad))
    assert refused.returncode != 0 and 'unknown field "bogus"' in refused.stderr
    offloading = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
                  "metadata": {"name": "offloading"},
                  "spec": {"podOffloadingStrategy": "Remote", "clusterSelector": {"nodeSelectorTerms": []}}}
    made = kubectl(api_sandbox, "-n", ns, "apply", "-f", "-", stdin=json.dumps(offloading))
    assert made.returncode == 0, made.stderr
    listed = kubectl(api_sandbox, "-n", ns, "get", "nso").stdout.split()
    assert "PODOFFLOADINGSTRATEGY" in listed and "Remote" in listed


def test_events_table_shows_what_kubectl_get_events_prints(api_sandbox, core, ns):
    stamp = "2026-11-22T01:00:00Z"
    core.create_namespaced_event(ns, {
        "metadata": {"name": "p.1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns,
                                                        "fieldPath": "spec.containers{main}"},
        "type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container main ",
        "source": {"component": "kubelet", "host": "node-1"}, "count": 4,
        "firstTimestamp": stamp, "lastTimestamp": stamp})
    req = urllib.request.Request(f"{api_sandbox.url}/api/v1/namespaces/{ns}/events",
                                 headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        printed = json.loads(resp.read())
    columns = [(c["name"], c["priority"]) for c in printed["columnDefinitions"]]
    assert columns == [("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1),
                       ("Message", 0), ("First Seen", 1), ("Count", 1), ("Name", 1)]
    [row] = printed["rows"]
    assert row["cells"][1:] == ["Warning", "BackOff", "pod/p", "spec.containers{main}", "kubelet, node-1",
                                "Back-off restarting failed container main", row["cells"][0], 4, "p.1"]
    assert row["cells"][0].endswith(("s", "m", "h", "d"))
    if shutil.which("kubectl"):
        out = kubectl(api_sandbox, "-n", ns, "get", "events").stdout.splitlines()
        assert out[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
        assert out[1].split()[1:4] == ["Warning", "BackOff", "pod/p"]


def test_bodies_are_compact_json_ending_in_a_newline_as_kube_apiserver_writes_them(api_sandbox):
    """kube-apiserver writes Go's json.Encoder output (no spaces, then a newline), and clients show a Status body
    as sent: the Python client's e2e test of create_from_yaml compares FailToCreateError's text with it."""
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{api_sandbox.url}/api/v1/namespaces/default/configmaps/nope", timeout=60)
    body = refused.value.read()
    assert body.startswith(b'{"kind":"Status","apiVersion":"v1",') and body.endswith(b"}\n"), body
    # metav1.Status's field order: the details, then the code last
    assert b'"details":{"name":"nope","kind":"configmaps"},"code":404}\n' in body, body
    with urllib.request.urlopen(f"{api_sandbox.url}/api/v1/namespaces", timeout=60) as resp:
        listed = resp.read()
    assert b'": ' not in listed and b', "' not in listed and listed.endswith(b"}\n"), listed
