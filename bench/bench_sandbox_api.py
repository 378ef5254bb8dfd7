"""Requests per second of the sandbox API emulator through the official client, on this machine.

The server runs as `gpu-offload sandbox` in its own process (as users and tests of other packages run it);
the client is the official `kubernetes` client with one keep-alive connection (its model deserialization
dominates big lists), and raw urllib3 requests for the server's own rate. Prints a table with the
machine and the date. Usage: .venv/bin/python bench/bench_sandbox_api.py [--n 300]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import kubernetes
import urllib3
from harness import (  # bench/harness.py: the script's folder is on sys.path
    Run,
    Stopwatch,
    sandbox_process,
    timed,
)
from kubernetes import watch


def timed_rate(n: int, fn: Callable[[int], object]) -> float:
    """Calls a second of ``fn(0)`` .. ``fn(n - 1)``, one after another."""
    index = iter(range(n))
    wall, _ = timed(lambda: fn(next(index)), n)
    return n / (sum(wall) / 1000)


def watch_rate(core: kubernetes.client.CoreV1Api, ns: str, rv: str, n: int) -> tuple[float, float]:
    """(replayed events/s from a resourceVersion, live events/s while another client writes)."""
    w = watch.Watch()
    start = Stopwatch()
    got = 0
    for _ in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=120):
        got += 1
        if got == n:
            w.stop()
    replay = got / start.seconds
    live_rv = core.list_namespaced_config_map(ns).metadata.resource_version
    seen, done = [0], threading.Event()
    writer_client = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(core.api_client.configuration))

    def write() -> None:
        for i in range(n):
            writer_client.patch_namespaced_config_map(f"cm-{i}", ns, {"data": {"v": "live"}})
        done.set()

    w = watch.Watch()
    start = Stopwatch()
    threading.Thread(target=write, daemon=True).start()
    for _ in w.stream(core.list_namespaced_config_map, ns, resource_version=live_rv, timeout_seconds=120):
        seen[0] += 1
        if seen[0] == n:
            w.stop()
    return replay, seen[0] / start.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="requests per operation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, sandbox_process(Path(tmp)) as kubeconfig:
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
             timed_rate(n, lambda i: core.create_namespaced_config_map("bench", {"metadata": {"name": f"cm-{i}"},
                                                                               "data": {"k": "v"}})),
             timed_rate(n, raw_create)),
            ("get configmap", timed_rate(n, lambda i: core.read_namespaced_config_map(f"cm-{i}", "bench")),
             timed_rate(n, lambda i: raw.request("GET", f"{base}/raw-{i}"))),
            (f"list 1 of {2 * n} by label selector",
             timed_rate(n // 3, lambda i: core.list_namespaced_config_map("bench", label_selector="a=b")),
             timed_rate(n // 3, lambda i: raw.request("GET", f"{base}?labelSelector=a%3Db"))),
            (f"list all {2 * n} configmaps",
             timed_rate(max(n // 30, 3), lambda i: core.list_namespaced_config_map("bench")),
             timed_rate(max(n // 30, 3), lambda i: raw.request("GET", base))),
        ]
        replay, live = watch_rate(core, "bench", before, n)
        rows += [(f"watch events, replay of {n} from a resourceVersion", replay, None),
                 (f"watch events, live while another client patches {n}", live, None),
                 (f"delete configmap (ownerReference scan over {2 * n} objects)",
                  timed_rate(n, lambda i: core.delete_namespaced_config_map(f"cm-{i}", "bench")),
                  timed_rate(n, lambda i: raw.request("DELETE", f"{base}/raw-{i}")))]
    run = Run("sandbox_api", "Sandbox API emulator")
    run.note("server: gpu-offload sandbox (separate process); client: kubernetes, one keep-alive connection")
    for name, rate, raw_rate in rows:
        run.figure(f"{name}, official client", rate, "/s", lower_is_better=False)
        if raw_rate:
            run.figure(f"{name}, raw HTTP (urllib3)", raw_rate, "/s", lower_is_better=False)
    run.write()

if __name__ == "__main__":
    main()
