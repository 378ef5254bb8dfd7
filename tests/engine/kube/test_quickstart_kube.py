"""examples/quickstart.ipynb, unchanged, in a real kernel whose environment selects the kubernetes backend
(as the hub's spawner sets it): every cell runs in a pod on a sandbox donor (untrusted: outputs come back
as plain data), large arrays go through object storage, the session keeps its state, and nothing is left
behind once the kernel is gone."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import nbformat
import pytest
from gpu_offload.sandbox.fixtures import wait_until
from nbclient import NotebookClient

from .conftest import BUCKET, PROJECT_IMAGE, leftovers

NOTEBOOK = Path(__file__).resolve().parents[3] / "examples" / "quickstart.ipynb"


def test_the_quickstart_notebook_runs_on_the_kubernetes_backend(origin: Any, core: Any, namespace: str, s3: Any,
                                                                s3_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    environment = {
        "KUBECONFIG": str(origin.sandbox.kubeconfig), "GPU_OFFLOAD_BACKEND": "kubernetes",
        "GPU_OFFLOAD_NAMESPACE": namespace, "GPU_OFFLOAD_IMAGE": PROJECT_IMAGE,  # matplotlib for the figure
        "GPU_OFFLOAD_S3_ENDPOINT": s3_endpoint, "GPU_OFFLOAD_S3_BUCKET": BUCKET,
        "GPU_OFFLOAD_KERNEL_ID": f"nb-{uuid.uuid4().hex[:8]}", "JUPYTERHUB_USER": "alice@example.org",
    }
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    pods_seen: set[str] = set()

    def on_cell_executed(**_: Any) -> None:
        pods_seen.update(p.metadata.name for p in core.list_namespaced_pod(namespace).items)

    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                            on_cell_executed=on_cell_executed)
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    assert not [o for o in outputs if o["output_type"] == "error"], text
    assert "total in the notebook: 45" in text and "step 2" in text
    assert "ndarray (1000000,) float64" in text
    assert "counter on the runner: 2" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # the sandbox's donors are untrusted: the figure's objects cannot come back, and only they are warned about
    noticed = "\n".join(o.get("data", {}).get("text/plain", "") for o in outputs if o["output_type"] == "display_data")
    warnings = [line for line in noticed.splitlines() if line.startswith("gpu_offload: warning")]
    assert warnings and all("cannot come back from an untrusted cluster" in w for w in warnings), warnings
    assert {w.split("`")[1] for w in warnings} == {"fig", "ax"}, warnings
    assert "embedded local backend" not in text
    assert pods_seen  # the cells ran in pods
    wait_until(lambda: not leftovers(core, namespace), "every pod and Secret removed after the kernel exited")
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert left == [], left
