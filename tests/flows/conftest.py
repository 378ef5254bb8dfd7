"""Real Metaflow in subprocesses against a real S3 API (a moto server where the sandbox's pods reach it too),
and pod-spec checks.

Every flow is copied into its own temporary folder (Metaflow packages the flow's folder), runs with its own
HOME (no kubeconfig, no Metaflow config of the machine) and writes its datastore to the moto bucket.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox import objectstore
from gpu_offload.sandbox.fixtures import OriginPool, origin_fixture, origin_key, pooled_as
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key, pooled_kueue_origin
from gpu_offload.sandbox.liqo import seed as liqo

from ..realcluster.realorigin import RealOrigin, clusters, seeded_origin
from ..sandbox.kueue_setup import synced_pool

DATA = Path(__file__).resolve().parent / "data"
BUCKET = "gpu-offload-flows"
ONLY_JSON = ("argo-workflows", "create", "--only-json")
INVENTORY = {"METAFLOW_GPU_OFFLOAD_INVENTORY": str(DATA / "inventory.json")}
K8S_VERSION = "1.36"
LIQO_CRDS = Path(__file__).resolve().parents[2] / ".." / "shared" / "liqo-crds"
# Named like the offline inventory's donors, so offload_flow.py places the same way live and offline.
DONORS = (liqo.Donor("donor-a", 4, "A100", "2.00"), liqo.Donor("donor-b", 8, "L4", "0.80"))
# The flows under test place steps on these donors, which @gpu_offload allows only on trusted clusters: the
# deploying process's origin trusts them (tests of the refusal unset it).
TRUSTING = {"GPU_OFFLOAD_TRUSTED_CLUSTERS": ",".join(d.cluster_id for d in DONORS)}
OFFLOADED = "gpu-jobs"
NOT_OFFLOADED = "plain"
# Metaflow's default image (python:3.x) runs with this interpreter: it has what Metaflow's pod bootstrap
# installs (boto3, requests), so the bootstrap's pip finds them and needs no network.
FLOWS_MAP = (("python:*", sys.executable),)
# Each flows module peers DONORS into the flows' shared origin (a module with other donors, test_part_of_a_gpu.py,
# peers its own), so what outlives a module (the object store) takes the origin without holding donors.
origin = origin_fixture(LIQO_CRDS, donors=DONORS, image_map=FLOWS_MAP)
KUEUE_FLOWS: dict[str, Any] = {
    "crds": [LIQO_CRDS, LIQO_CRDS.parent / "kueue-crds"], "image_map": FLOWS_MAP,
    # as docs/queueing.md asks Kueue to be configured: Metaflow's pods request ephemeral-storage, which the
    # project's ClusterQueue does not cover
    "kueue": KueueOptions(exclude_resource_prefixes=("ephemeral-storage",))}


def queued_flows_origin(donors: tuple[liqo.Donor, ...], real_nodes: int | None = None) -> Any:
    """The ``kueue_origin`` of a queued flows module, on each cluster: the real cluster with ``donors`` seeded (the
    first ``real_nodes`` on the real kubelets' nodes, see ``seeded_origin``), or the session's sandbox origin with
    Kueue of ``KUEUE_FLOWS`` (shared by the queued flows modules), ``donors`` peered for the module."""

    @pytest.fixture(scope="module", params=clusters(), name="kueue_origin")
    @pooled_as(kueue_origin_key(donors=donors, **KUEUE_FLOWS))
    def either(request: pytest.FixtureRequest, origin_pool: OriginPool) -> Iterator[Any]:
        if request.param == "real":  # real Kubernetes and Kueue 0.19
            with seeded_origin(donors, LIQO_CRDS, real_nodes=real_nodes) as real:
                yield real
            return
        with pooled_kueue_origin(origin_pool, request.node.nodeid, donors=donors, **KUEUE_FLOWS) as (running, _):
            yield running

    return either


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def keys(self, prefix: str = "") -> list[str]:
        import boto3

        s3 = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
            region_name="us-east-1",
        )
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def s3_of(origin: Any) -> Iterator[S3Server]:
    """A module's object store on ``origin``'s host address, with the flows' bucket."""
    with objectstore.s3_server(origin.host_address, [BUCKET]) as endpoint:
        yield S3Server(endpoint)


def hub_user_namespace(origin: Any, name: str, cluster_ids: list[str]) -> str:
    """A hub user's namespace ``name`` on ``origin``: offloaded to ``cluster_ids``, with its LocalQueue from
    `gpu-offload queues sync`."""
    with origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        core.create_namespace({"metadata": {"name": name, "labels": {"gpu-offload.io/user-namespace": "true"}}})
        custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", name, "namespaceoffloadings",
                                               namespace_offloading(name, cluster_ids))
    synced_pool(origin.sandbox, name)
    return name


def drop_sandbox_namespace(origin: Any, name: str) -> None:
    """Delete a module's namespace on the sandbox, whose origin the next module shares (the real cluster's seeded
    origin is left as the real-cluster stage runs it)."""
    if isinstance(origin, RealOrigin):
        return
    with origin.sandbox.api_client() as client:
        kubernetes.client.CoreV1Api(client).delete_namespace(name)


@pytest.fixture(scope="session")
@pooled_as(origin_key(LIQO_CRDS, {"image_map": FLOWS_MAP}))  # on the flows' origin's xdist worker
def s3_server(origin_pool: OriginPool) -> Iterator[S3Server]:
    """moto's S3 server with one bucket for the session, where Metaflow here and its step pods both reach it: on the
    flows' origin's host address (the origin itself, whatever donors a module peers)."""
    flows_origin = origin_pool.shared(LIQO_CRDS, image_map=FLOWS_MAP).running
    with objectstore.s3_server(flows_origin.host_address, [BUCKET]) as endpoint:
        yield S3Server(endpoint)


@dataclass(frozen=True)
class FlowRun:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stderr
        return json.loads(self.stdout[self.stdout.index("{") :])


@dataclass
class FlowRunner:
    """Runs ``python <flow> <args>`` the way a user would, with Metaflow configured for the moto S3."""

    workdir: Path
    s3: S3Server

    def env(self, extra: Mapping[str, str]) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "SYSTEMROOT") if k in os.environ}
        return {
            **keep,
            "HOME": str(home),
            "USERNAME": "tester",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "METAFLOW_S3_ENDPOINT_URL": self.s3.endpoint,
            "METAFLOW_DEFAULT_DATASTORE": "s3",
            "METAFLOW_DATASTORE_SYSROOT_S3": f"s3://{BUCKET}/{self.workdir.name}",
            "METAFLOW_DEFAULT_METADATA": "local",
            **TRUSTING,
            **extra,
        }

    def __call__(
        self, flow: str, *args: str, env: Mapping[str, str] | None = None, timeout: float = 240
    ) -> FlowRun:
        target = self.workdir / flow
        if not target.exists():
            shutil.copy(DATA / flow, target)
        proc = subprocess.run(
            [sys.executable, str(target), *args],
            cwd=self.workdir,
            env=self.env(env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return FlowRun(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def run_flow(tmp_path: Path, s3_server: S3Server) -> FlowRunner:
    """``run_flow("x_flow.py", "argo-workflows", "create", "--only-json", env={...})``."""
    return FlowRunner(tmp_path, s3_server)


def templates(workflow: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The Argo WorkflowTemplate's step templates by step name (not its hooks)."""
    return {
        t["name"]: t
        for t in workflow["spec"]["templates"]
        if "container" in t and "metaflow/step_name" in (t.get("metadata") or {}).get("annotations", {})
    }


def _drop_nulls(value: Any) -> Any:
    # Argo treats a null field as absent; the Kubernetes schema does not accept null for arrays/objects.
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def pod_from_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod that Argo makes from a container template: pod-level fields plus the one container."""
    spec_fields = ("nodeSelector", "tolerations", "volumes", "serviceAccountName", "affinity")
    spec = {k: template[k] for k in spec_fields if k in template}
    spec["containers"] = [{"name": "main", **template["container"]}]
    spec["restartPolicy"] = "Never"
    metadata = {"name": f"pod-{template['name']}".replace("_", "-"), **template.get("metadata", {})}
    return _drop_nulls({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})


def validate_pod(pod: Mapping[str, Any]) -> None:
    """Strict schema validation of a Pod (unknown fields are errors)."""
    kubernetes_validate.validate(dict(pod), K8S_VERSION, strict=True)


@pytest.fixture(scope="session")
def offload_deployment(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> dict[str, dict]:
    """Argo WorkflowTemplates of offload_flow.py: placed from the offline inventory, and without @gpu_offload."""
    runner = FlowRunner(tmp_path_factory.mktemp("offload"), s3_server)
    return {
        "offloaded": runner("offload_flow.py", *ONLY_JSON, env=INVENTORY).json(),
        "baseline": runner("offload_flow.py", *ONLY_JSON, env={"OFFLOAD_OFF": "1"}).json(),
    }


@pytest.fixture(scope="module")
def cluster(origin: Any) -> Iterator[dict[str, str]]:
    """Environment for Metaflow to use the origin: its kubeconfig and an offloaded namespace, for the module (its
    donors are peered for the module; the namespaces go with it).

    ``gpu-jobs`` is offloaded to both donors, ``plain`` exists and is not offloaded.
    """
    with origin.sandbox.api_client() as client:
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        for name in (OFFLOADED, NOT_OFFLOADED):
            core.create_namespace({"metadata": {"name": name}})
        custom.create_namespaced_custom_object(
            "offloading.liqo.io", "v1beta1", OFFLOADED, "namespaceoffloadings",
            namespace_offloading(OFFLOADED, [d.cluster_id for d in DONORS]),
        )
    yield {"KUBECONFIG": str(origin.sandbox.kubeconfig), "METAFLOW_KUBERNETES_NAMESPACE": OFFLOADED}
    with origin.sandbox.api_client() as client:
        for name in (OFFLOADED, NOT_OFFLOADED):
            kubernetes.client.CoreV1Api(client).delete_namespace(name)


def jobs_and_pods(origin: Any, label_selector: str, namespace: str = OFFLOADED) -> tuple[list[Any], list[Any]]:
    """The Jobs and Pods in the offloaded namespace that match ``label_selector``, read from the origin."""
    with origin.sandbox.api_client() as client:
        jobs = kubernetes.client.BatchV1Api(client).list_namespaced_job(namespace, label_selector=label_selector)
        pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod(namespace, label_selector=label_selector)
    return jobs.items, pods.items
