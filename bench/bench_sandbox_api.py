"""Requests per second of the sandbox API emulator through the official client, on this machine.

The server runs as `gpu-offload sandbox` in its own process (as users and tests of other packages run it);
the client is the official `kubernetes` client with one keep-alive connection (its model deserialization
dominates big lists), and raw urllib3 requests for the server's own rate. Prints a table with the
machine and the date. Usage: .venv/bin/python bench/bench_sandbox_api.py [--n 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import kubernetes
import urllib3
from kubernetes import watch


def start_server(workdir: Path) -> tuple[subprocess.Popen[str], Path]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_offload.cli", "sandbox", "--kubeconfig", str(kubeconfig)],
                            stdout=subprocess.PIPE, text=True)
    for _ in range(4):  # the banner follows the kubeconfig, which follows the API answering
        proc.stdout.readline()  # type: ignore[union-attr]
    return proc, kubeconfig


def timed(n: int, fn) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - start)


def watch_rate(core: kubernetes.client.CoreV1Api, ns: str, rv: str, n: int) -> tuple[float, float]:
    """(replayed events/s from a resourceVersion, live events/s while another client writes)."""
    w = watch.Watch()
    start = time.perf_counter()
    got = 0
    for _ in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=120):
        got += 1
        if got == n:
            w.stop()
    replay = got / (time.perf_counter() - start)
    live_rv = core.list_namespaced_config_map(ns).metadata.resource_version
    seen, done = [0], threading.Event()
    writer_client = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(core.api_client.configuration))

    def write() -> None:
        for i in range(n):
            writer_client.patch_namespaced_config_map(f"cm-{i}", ns, {"data": {"v": "live"}})
        done.set()

    w = watch.Watch()
    start = time.perf_counter()
    threading.Thread(target=write, daemon=True).start()
    for _ in w.stream(core.list_namespaced_config_map, ns, resource_version=live_rv, timeout_seconds=120):
        seen[0] += 1
        if seen[0] == n:
            w.stop()
    return replay, seen[0] / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="requests per operation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, kubeconfig = start_server(Path(tmp))
        try:
            config = kubernetes.client.Configuration()
            kubernetes.config.load_kube_config(str(kubeconfig), client_configuration=config)
            core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
            core.create_namespace({"metadata": {"name": "bench"}})
            before = core.list_namespaced_config_map("bench").metadata.resource_version
            n = args.n
            raw = urllib3.PoolManager(maxsize=1)
            base = f"{config.host}/api/v1/namespaces/bench/configmaps"

            def raw_create(i: int) -> None:
                body = json.dumps({"metadata": {"name": f"raw-{i}"}, "data": {"k": "v"}})
                raw.request("POST", base, body=body, headers={"Content-Type": "application/json"})

            rows = [
                ("create configmap (POST, admission incl. schema)",
                 timed(n, lambda i: core.create_namespaced_config_map("bench", {"metadata": {"name": f"cm-{i}"},
                                                                                   "data": {"k": "v"}})),
                 timed(n, raw_create)),
                ("get configmap", timed(n, lambda i: core.read_namespaced_config_map(f"cm-{i}", "bench")),
                 timed(n, lambda i: raw.request("GET", f"{base}/raw-{i}"))),
                (f"list 1 of {2 * n} by label selector",
                 timed(n // 3, lambda i: core.list_namespaced_config_map("bench", label_selector="a=b")),
                 timed(n // 3, lambda i: raw.request("GET", f"{base}?labelSelector=a%3Db"))),
                (f"list all {2 * n} configmaps",
                 timed(max(n // 30, 3), lambda i: core.list_namespaced_config_map("bench")),
                 timed(max(n // 30, 3), lambda i: raw.request("GET", base))),
            ]
            replay, live = watch_rate(core, "bench", before, n)
            rows += [(f"watch events, replay of {n} from a resourceVersion", replay, None),
                     (f"watch events, live while another client patches {n}", live, None),
                     (f"delete configmap (ownerReference scan over {2 * n} objects)",
                      timed(n, lambda i: core.delete_namespaced_config_map(f"cm-{i}", "bench")),
                      timed(n, lambda i: raw.request("DELETE", f"{base}/raw-{i}")))]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load average {load:.1f} at the end")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print("server: gpu-offload sandbox (separate process); client: kubernetes 36, one keep-alive connection\n")
    print("| operation | official client /s | raw HTTP (urllib3) /s |")
    print("|---|---:|---:|")
    for name, rate, raw_rate in rows:
        print(f"| {name} | {rate:,.0f} | {f'{raw_rate:,.0f}' if raw_rate else '-'} |")


if __name__ == "__main__":
    main()
