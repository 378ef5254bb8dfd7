"""How long each Metaflow path of ``@gpu_offload`` takes, end to end with real Metaflow.

Paths, each a fresh ``python flow.py ...`` process as a user runs it, against a moto S3 server beside
the sandbox origin with two Liqo donors (where its pods reach it), the origin serving live placement and ``run``:

- ``argo-workflows create --only-json`` of a 4-step flow: without ``@gpu_offload`` (the baseline), with it
  placed from configuration, from an offline inventory file, and live from the cluster;
- a bad input caught at validation (``@kubernetes(gpu=2)`` with ``@gpu_offload(gpus=1)``);
- ``run`` with one offloaded step executed as a Job by the sandbox's test kubelet.

Prints a Markdown table with the machine and the date. Run: ``.venv/bin/python bench/bench_flows.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import kubernetes
from gpu_offload.liqo_peering.specs import namespace_offloading
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.objectstore import s3_server
from harness import Run, timed_process  # bench/harness.py: the script's folder is on sys.path
from harness import origin as origin_of

REPO = Path(__file__).resolve().parents[1]
FLOWS = REPO / "tests" / "flows" / "data"
BUCKET = "bench-flows"
NAMESPACE = "gpu-jobs"
ONLY_JSON = ("argo-workflows", "create", "--only-json")
DONORS = (liqo.Donor("donor-a", 4, "A100", "2.00"), liqo.Donor("donor-b", 8, "L4", "0.80"))


def prepare(origin: object) -> str:
    with origin.sandbox.api_client() as client:  # type: ignore[attr-defined]
        core, custom = kubernetes.client.CoreV1Api(client), kubernetes.client.CustomObjectsApi(client)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        custom.create_namespaced_custom_object("offloading.liqo.io", "v1beta1", NAMESPACE, "namespaceoffloadings",
                                               namespace_offloading(NAMESPACE, ["donor-a", "donor-b"]))
        # Metaflow requests ephemeral-storage; the sandbox's virtual nodes report none (see tests/flows).
        for node in core.list_node(label_selector="liqo.io/type=virtual-node").items:
            status = {f: {**getattr(node.status, f), "ephemeral-storage": "100Gi"} for f in ("capacity", "allocatable")}
            core.patch_node_status(node.metadata.name, {"status": status})
    return str(origin.sandbox.kubeconfig)  # type: ignore[attr-defined]


def flow_seconds(workdir: Path, endpoint: str, flow: str, args: tuple[str, ...], extra: dict[str, str],
                 expect_ok: bool = True) -> float:
    """Seconds of one ``python flow.py args`` process, run as a user would against the S3 ``endpoint``."""
    shutil.copy(FLOWS / flow, workdir / flow)
    (workdir / "home").mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir / "home"), "USERNAME": "bench",
           "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1",
           "METAFLOW_S3_ENDPOINT_URL": endpoint, "METAFLOW_DEFAULT_DATASTORE": "s3",
           "METAFLOW_DATASTORE_SYSROOT_S3": f"s3://{BUCKET}/{workdir.name}", "METAFLOW_DEFAULT_METADATA": "local",
           **extra}
    ran = timed_process([sys.executable, flow, *args], cwd=workdir, env=env)
    if (ran.done.returncode == 0) != expect_ok:
        raise SystemExit(f"{flow} {' '.join(args)}: unexpected exit {ran.done.returncode}\n{ran.done.stderr[-2000:]}")
    return ran.wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per argo path (default 3)")
    parser.add_argument("--skip-run", action="store_true", help="leave out the (slow) sandbox run")
    args = parser.parse_args()
    inventory = {"METAFLOW_GPU_OFFLOAD_INVENTORY": str(FLOWS / "inventory.json")}
    rows: list[tuple[str, list[float]]] = []
    with tempfile.TemporaryDirectory() as tmp, \
            origin_of(DONORS, image_map=(("python:*", sys.executable),)) as origin, \
            s3_server(origin.host_address, [BUCKET]) as endpoint:
        kubeconfig = prepare(origin)
        live = {"KUBECONFIG": kubeconfig, "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE,
                "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE": "live"}
        cases = [
            ("argo --only-json, no @gpu_offload (baseline)", "offload_flow.py", ONLY_JSON, {"OFFLOAD_OFF": "1"}, True),
            ("argo --only-json, placed from config", "offload_flow.py", ONLY_JSON, {}, True),
            ("argo --only-json, placed from inventory file", "offload_flow.py", ONLY_JSON, inventory, True),
            ("argo --only-json, placed live (sandbox)", "offload_flow.py", ONLY_JSON, live, True),
            ("bad input refused (gpu conflict)", "bad_flow.py", ONLY_JSON, {"BAD_CASE": "conflict-gpu"}, False),
        ]
        for n, (label, flow, argv, extra, ok) in enumerate(cases):
            rows.append((label, [flow_seconds(Path(tempfile.mkdtemp(dir=tmp, prefix=f"c{n}-")), endpoint, flow, argv,
                                       extra, ok) for _ in range(args.repeat)]))
        if not args.skip_run:
            run_env = {"KUBECONFIG": kubeconfig, "METAFLOW_KUBERNETES_NAMESPACE": NAMESPACE}
            rows.append(("run, 1 offloaded step of 3 (Job on sandbox)",
                         [flow_seconds(Path(tempfile.mkdtemp(dir=tmp, prefix="run-")), endpoint, "sandbox_flow.py",
                                ("run",), run_env)]))
    run = Run("flows", "Metaflow paths")
    run.note("each run: a fresh `python flow.py ...` process (Metaflow import, validation, S3 package upload)")
    for label, times in rows:
        run.figure(label, times, "s")
    run.write()

if __name__ == "__main__":
    main()
