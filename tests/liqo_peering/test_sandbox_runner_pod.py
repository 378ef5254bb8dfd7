"""The built runner Pod and Secret, sent with the official client, run on the placed virtual node, the bundle
written to the pod's stdin through an attach."""

from __future__ import annotations

import io
import uuid
import zipfile

import kubernetes
from gpu_offload.liqo_peering.client import LiqoClient
from gpu_offload.liqo_peering.placement import PlacementRequest, place
from gpu_offload.liqo_peering.specs import RunnerPodSpec, runner_pod, runner_secret, runner_selector
from gpu_offload.sandbox.fixtures import wait_until
from kubernetes.stream import stream

# A stand-in for the runner zipapp: prints the bundle it reads where the real runner would (``-``: stdin).
RUNNER_MAIN = """import sys
path = sys.argv[sys.argv.index("--bundle") + 1]
print("bundle says:", open(0 if path == "-" else path, "rb").read().decode(), flush=True)
"""


def zipapp(main: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("__main__.py", main)
    return buf.getvalue()


def test_runner_pod_runs_the_bundle_from_its_stdin_and_takes_the_secret_along(api_client) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    liqo_client = LiqoClient(api_client, request_timeout=30)
    namespace = f"alice-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        placement = place(liqo_client.read_inventory(), PlacementRequest(1, "L4"))
        liqo_client.ensure_offloading(namespace, [placement.cluster_id])
        spec = RunnerPodSpec(run_id=uuid.uuid4().hex[:10], namespace=namespace, image="python:3.11",
                             user="alice@example.org", kernel="kernel-1", scheduling=placement.scheduling_fragment(),
                             timeout=120)
        pod = runner_pod(spec)
        name = pod["metadata"]["name"]
        created = core.create_namespaced_pod(namespace, pod)
        core.create_namespaced_secret(namespace, runner_secret(pod, created.metadata.uid, zipapp(RUNNER_MAIN)))
        wait_until(lambda: core.read_namespaced_pod(name, namespace).status.phase == "Running", "runner started")
        ws = stream(core.connect_get_namespaced_pod_attach, name, namespace, container="runner", stdin=True,
                    stdout=False, stderr=False, tty=False, _preload_content=False)
        ws.write_stdin(b"hello from the bundle")
        ws.close()  # stdinOnce: the end of the attach is the end of the runner's input
        phase = wait_until(lambda: _finished(core, namespace, name), "runner pod finished", timeout=120)
        # _preload_content=False: client 36 hands back str(bytes) ("b'...'") for a preloaded log.
        log = core.read_namespaced_pod_log(name, namespace, _preload_content=False).data.decode()
        assert (phase, log) == ("Succeeded", "bundle says: hello from the bundle\n")
        assert core.read_namespaced_pod(name, namespace).spec.node_name == placement.virtual_node == "donor-2-gpu"
        selector = runner_selector(run_id=spec.run_id)
        assert [s.metadata.name for s in core.list_namespaced_secret(namespace, label_selector=selector).items] == [
            f"{name}-runner"]
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wait_until(lambda: not core.list_namespaced_secret(namespace, label_selector=selector).items,
                   "Secret collected with its pod")
    finally:
        core.delete_namespace(namespace)


def _finished(core, namespace: str, name: str) -> str | None:
    phase = core.read_namespaced_pod(name, namespace).status.phase
    return phase if phase in ("Succeeded", "Failed") else None
