"""Start-up time of the sandbox origin with 2 and 20 Liqo donors, on this machine.

Each configuration runs twice: ``host`` (pods share the host's network and run as the sandbox's user, as
before sandbox part 3 and as on a machine without root) and ``isolated`` (as root: a network namespace, veth
and hosts file per pod, every container through its shim in a PID and mount namespace).

Four figures per configuration (``--runs`` samples each):

- ``api ready``: in-process, from building the API (CRDs loaded, donors seeded, controllers and kubelet
  installed) until the HTTP API answers ``/version``;
- ``first pod running``: after that, a pod on a stock image created through the official client until
  its phase is Running (includes building the stock-image venv once per sandbox);
- ``next pods running``: the median over 5 more pods, one after the other, each from create to Running;
- ``cli kubeconfig``: ``gpu-offload sandbox --donors N`` as a subprocess, from launch until the kubeconfig
  file appears (includes the interpreter's imports).

Usage: .venv/bin/python bench/bench_sandbox_startup.py [--runs 3] [--donors 2,20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import kubernetes
from gpu_offload.sandbox.apiserver.kubeconfig import write_kubeconfig
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.origin import LiqoOrigin, OriginOptions
from gpu_offload.sandbox.server import ApiServer
from gpu_offload.sandbox.testing import make_api
from harness import Run, Stopwatch  # bench/harness.py: the script's folder is on sys.path

LIQO_CRDS = Path(__file__).resolve().parents[1] / ".." / "shared" / "liqo-crds"


def _pod_running(core: kubernetes.client.CoreV1Api, name: str) -> float:
    watch = Stopwatch()
    core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(60)"]}]}})
    while core.read_namespaced_pod(name, "default").status.phase != "Running":
        time.sleep(0.01)
    return watch.seconds


def in_process(donors: int, crds: Path | None, isolate: bool) -> tuple[float, float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    watch = Stopwatch()
    origin = LiqoOrigin(OriginOptions(workdir / "state", liqo.donors(donors), isolate=isolate))
    server = ApiServer(make_api(crds), plugins=[origin.plugin]).start_in_thread()
    try:
        urllib.request.urlopen(f"{server.url}/version", timeout=30).read()
        api_ready = watch.seconds
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(str(write_kubeconfig(workdir / "kc", server.url)),
                                           client_configuration=config)
        with kubernetes.client.ApiClient(config) as client:
            core = kubernetes.client.CoreV1Api(client)
            assert len(core.list_node(label_selector="liqo.io/type=virtual-node").items) == donors
            first_pod = _pod_running(core, "p")
            next_pods = statistics.median(_pod_running(core, f"p{i}") for i in range(5))
    finally:
        server.stop_thread()
    return api_ready, first_pod, next_pods


def cli(donors: int, crds: Path | None) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    kubeconfig = workdir / "kubeconfig"
    cmd = [sys.executable, "-m", "gpu_offload.cli", "sandbox", "--donors", str(donors), "--kubeconfig",
           str(kubeconfig), "--state-dir", str(workdir / "state")] + (["--crds", str(crds)] if crds else [])
    watch = Stopwatch()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not kubeconfig.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox exited with {proc.returncode}")
            time.sleep(0.01)
        return watch.seconds
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--donors", default="2,20", help="donor counts to start (comma-separated)")
    args = parser.parse_args()
    run = Run("sandbox_startup", "Start-up time of the sandbox origin")
    run.note(f"{args.runs} runs per configuration")
    for donors in (int(d) for d in args.donors.split(",")):
        for label, crds in (("built-in CRDs", None), ("real CRDs (--crds)", LIQO_CRDS)):
            run.figure(f"{donors} donors, {label}: cli kubeconfig", [cli(donors, crds) for _ in range(args.runs)], "s")
            for mode in ("host", "isolated"):
                ready, first, after = zip(*(in_process(donors, crds, mode == "isolated") for _ in range(args.runs)),
                                          strict=True)
                name = f"{donors} donors, {label}, {mode} pods"
                run.figure(f"{name}: api ready", ready, "s")
                run.figure(f"{name}: first pod running", first, "s")
                run.figure(f"{name}: next pods running (median of 5 per run)", after, "s")
    run.write()


if __name__ == "__main__":
    main()
