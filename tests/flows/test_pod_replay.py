"""Inside the step's pod, the extension travels in the code package and replays the decision offline.

The code package is the one ``argo-workflows create`` uploaded to (moto) S3, unpacked and run the way
a stock image runs it: ``python -S`` with only Metaflow's own pod dependencies (requests, boto3) on the
path, so neither ``gpu_offload`` nor the Kubernetes client is installed; the pod's environment is the
template's (the recorded placement, ``METAFLOW_KUBERNETES_WORKLOAD``), and no inventory is reachable.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path
from urllib.parse import urlparse

import pytest

from .conftest import DATA, S3Server, templates

pytestmark = pytest.mark.slow

# What Metaflow's bootstrap installs in a pod besides the code package (and what those need).
POD_DEPENDENCIES = (
    "requests", "urllib3", "idna", "certifi", "charset_normalizer", "boto3", "botocore", "s3transfer",
    "jmespath", "dateutil", "six.py",
)


def _download(s3: S3Server, url: str) -> bytes:
    import boto3

    where = urlparse(url)
    client = boto3.client(
        "s3", endpoint_url=s3.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
        region_name="us-east-1",
    )
    return client.get_object(Bucket=where.netloc, Key=where.path.lstrip("/"))["Body"].read()


def _stock_site(root: Path) -> Path:
    site = root / "stock"
    site.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for name in POD_DEPENDENCIES:
        (site / name).symlink_to(purelib / name)
    return site


def test_the_pod_rebuilds_the_same_kubernetes_step_from_the_code_package(
    offload_deployment: dict, s3_server: S3Server, tmp_path: Path
) -> None:
    train = templates(offload_deployment["offloaded"])["train"]
    env = {e["name"]: e.get("value") for e in train["container"]["env"]}
    pod = tmp_path / "pod"
    with tarfile.open(fileobj=io.BytesIO(_download(s3_server, env["METAFLOW_CODE_URL"]))) as package:
        package.extractall(pod, filter="data")
    shutil.copy(DATA / "pod_probe.py", pod / "pod_probe.py")
    pod_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "USERNAME": "tester",
        "PYTHONPATH": os.pathsep.join([str(_stock_site(tmp_path)), str(pod / ".mf_code"), str(pod)]),
        "METAFLOW_DATASTORE_SYSROOT_S3": env["METAFLOW_DATASTORE_SYSROOT_S3"],
        "METAFLOW_KUBERNETES_WORKLOAD": "1",
        "METAFLOW_GPU_OFFLOAD_PLACEMENT": env["METAFLOW_GPU_OFFLOAD_PLACEMENT"],
        # Present in every pod: the in-cluster API; the mutator must not use it.
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    }
    proc = subprocess.run(
        [sys.executable, "-S", "pod_probe.py"], cwd=pod, env=pod_env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])

    assert seen["gpu_offload_from"].startswith(str(pod / ".mf_code" / "gpu_offload"))
    assert seen["kubernetes_client_imported"] is False
    assert seen["steps"]["train"] == {"node_selector": train["nodeSelector"], "gpu": 1}
