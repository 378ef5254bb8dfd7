"""Start-up time of the sandbox origin with 2 and 20 Liqo donors, on this machine.

Each configuration runs twice: ``host`` (pods share the host's network and run as the sandbox's user, as
before sandbox part 3 and as on a machine without root) and ``isolated`` (as root: a network namespace, veth
and hosts file per pod, every container through its shim in a PID and mount namespace).

Four figures per configuration (median of ``--runs``):

- ``api ready``: in-process, from building the API (CRDs loaded, donors seeded, controllers and kubelet
  installed) until the HTTP API answers ``/version``;
- ``first pod running``: after that, a pod on a stock image created through the official client until
  its phase is Running (includes building the stock-image venv once per sandbox);
- ``next pods running``: the median over 5 more pods, one after the other, each from create to Running;
- ``cli kubeconfig``: ``gpu-offload sandbox --donors N`` as a subprocess, from launch until the kubeconfig
  file appears (includes the interpreter's imports).

Usage: .venv/bin/python bench/bench_sandbox_startup.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import kubernetes
from gpu_offload.sandbox.apiserver.kubeconfig import write_kubeconfig
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.origin import LiqoOrigin, OriginOptions
from gpu_offload.sandbox.server import ApiServer
from gpu_offload.sandbox.testing import make_api

LIQO_CRDS = Path(__file__).resolve().parents[1] / ".." / "shared" / "liqo-crds"


def _pod_running(core: kubernetes.client.CoreV1Api, name: str) -> float:
    t0 = time.perf_counter()
    core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [
        {"name": "c", "image": "python:3.11", "command": ["python3", "-c", "import time; time.sleep(60)"]}]}})
    while core.read_namespaced_pod(name, "default").status.phase != "Running":
        time.sleep(0.01)
    return time.perf_counter() - t0


def in_process(donors: int, crds: Path | None, isolate: bool) -> tuple[float, float, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    start = time.perf_counter()
    origin = LiqoOrigin(OriginOptions(workdir / "state", liqo.donors(donors), isolate=isolate))
    server = ApiServer(make_api(crds), plugins=[origin.plugin]).start_in_thread()
    try:
        urllib.request.urlopen(f"{server.url}/version", timeout=30).read()
        api_ready = time.perf_counter() - start
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
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not kubeconfig.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox exited with {proc.returncode}")
            time.sleep(0.01)
        return time.perf_counter() - start
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.node() or 'vm'} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; median of {args.runs} runs, seconds")
    print()
    print("| donors | CRDs | pods | api ready | first pod running | next pods running | cli kubeconfig |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for donors in (2, 20):
        for label, crds in (("built-in", None), ("real (--crds)", LIQO_CRDS)):
            launch = statistics.median(cli(donors, crds) for _ in range(args.runs))
            for mode in ("host", "isolated"):
                ready, first, after = zip(*(in_process(donors, crds, mode == "isolated") for _ in range(args.runs)),
                                          strict=True)
                print(f"| {donors} | {label} | {mode} | {statistics.median(ready):.2f} | "
                      f"{statistics.median(first):.2f} | {statistics.median(after):.3f} | {launch:.2f} |", flush=True)


if __name__ == "__main__":
    main()
