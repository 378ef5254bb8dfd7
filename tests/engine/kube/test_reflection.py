"""What Liqo's reflection hands the donors of a user namespace, on the sandbox (which copies Secrets and
ConfigMaps of an offloaded namespace to each selected donor by Liqo's rules, ``sandbox/reflection.py``).

The attack: a user namespace is offloaded to every peered cluster, as the hub's spawner does, and Liqo copies
its Secrets to all of them. A cell meant for the trusted donor must not leave its code, inputs or frame nonce
in a Secret that an untrusted donor is sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.base import Ranks
from gpu_offload.engine.backends.kube.backend import KubernetesBackend

from .conftest import leftovers, offloaded_everywhere, settings
from .helpers import run_cell

__all__ = ["offloaded_everywhere"]

CODE_MARKER = "c0de-only-for-the-trusted-donor"
INPUT_MARKER = "input-only-for-the-trusted-donor"


def payloads(copies: list[dict[str, Any]]) -> bytes:
    """Every byte of data a donor was sent, decoded (Secrets' values are base64)."""
    out = b""
    for obj in copies:
        for value in (obj.get("data") or {}).values():
            out += base64.b64decode(value) if obj.get("kind", "Secret") != "ConfigMap" else str(value).encode()
        for value in (obj.get("stringData") or {}).values():
            out += str(value).encode()
    return out


@pytest.fixture()
def trusting_donor_1(api_client: Any, offloaded_everywhere: str, core: Any) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(settings(offloaded_everywhere, trusted=("donor-1",)), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, offloaded_everywhere), "no pod or Secret left behind", timeout=60)


def test_a_trusted_only_cell_leaves_its_bundle_with_no_donor(trusting_donor_1, origin) -> None:
    user_ns: dict[str, Any] = {"x": INPUT_MARKER}
    outcome, sink, run = run_cell(trusting_donor_1, f"y = x + '{CODE_MARKER}'", user_ns, trusted_only=True)
    assert outcome.status == "ok", outcome.error
    assert run.current.ctx.cluster == "donor-1" and user_ns["y"] == INPUT_MARKER + CODE_MARKER
    for donor in ("donor-2", "donor-1"):  # the untrusted one first
        sent = origin.donor_copies.was_sent(donor)
        data = payloads(sent)
        # the bundle holds the nonce beside code and inputs: none of it is there
        assert CODE_MARKER.encode() not in data and INPUT_MARKER.encode() not in data, donor
        # the runner archive is reflected to every donor (a pod mounts it wherever it runs): it holds no user data
        assert any(o["metadata"]["name"] == f"{run.current.name}-runner" for o in sent), donor


def test_a_distributed_runs_bundle_reaches_its_pods_only(trusting_donor_1, origin) -> None:
    user_ns: dict[str, Any] = {"x": INPUT_MARKER}
    cell = f"import os\nr = int(os.environ['RANK'])\ny = x + '{CODE_MARKER}'"
    outcome, _, run = run_cell(trusting_donor_1, cell, user_ns, gpus=1, ranks=Ranks(nodes=2, procs_per_node=1),
                               trusted_only=True, timeout=300)
    assert outcome.status == "ok", outcome.error
    assert user_ns["y"] == INPUT_MARKER + CODE_MARKER
    for donor in ("donor-2", "donor-1"):  # the untrusted one first
        data = payloads(origin.donor_copies.was_sent(donor))
        assert CODE_MARKER.encode() not in data and INPUT_MARKER.encode() not in data, donor


def test_a_donor_pod_mounts_only_secrets_liqo_copied_to_its_donor(core, offloaded_everywhere) -> None:
    from gpu_offload.liqo_peering.placement import scheduling_fragment

    from .test_local_by_default import scheduled

    ns = offloaded_everywhere
    for name, marks in (("kept-home", {"liqo.io/skip-reflection": "true"}), ("copied", {})):
        core.create_namespaced_secret(ns, {"metadata": {"name": name, "annotations": marks},
                                           "stringData": {"k": "v"}})
    fragment = scheduling_fragment("donor-1", 0)
    for name in ("kept-home", "copied"):
        core.create_namespaced_pod(ns, {"metadata": {"name": f"mounts-{name}"}, "spec": {
            "restartPolicy": "Never", "tolerations": fragment["tolerations"], "affinity": fragment["affinity"],
            "containers": [{"name": "c", "image": "python:3.11-slim", "command": ["python3", "-c", "print(1)"],
                            "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
            "volumes": [{"name": "s", "secret": {"secretName": name}}]}})
    wait_until(lambda: core.read_namespaced_pod("mounts-copied", ns).status.phase == "Succeeded", "the pod ran")
    waiting = core.read_namespaced_pod("mounts-kept-home", ns)
    assert scheduled(core, ns, "mounts-kept-home") == ("donor-1-gpu", "")
    assert waiting.status.phase == "Pending"
    assert waiting.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    for name in ("kept-home", "copied"):
        core.delete_namespaced_pod(f"mounts-{name}", ns, grace_period_seconds=0)
