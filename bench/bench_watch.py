"""Client CPU per watch event: the official client's ``Watch(return_type="object")`` (what the inventory cache
used) against ``liqo_peering.watching.WatchStream`` (what it uses now), side by side in one run.

Both read the same watch from the sandbox over real HTTP: the initial ADDED events of ``--pods`` pods shaped
like runner pods. CPU is the reading thread's own (``time.thread_time``), so the in-process server's work is
not counted.

Usage: .venv/bin/python bench/bench_watch.py [--pods 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes
from gpu_offload.liqo_peering.watching import WatchStream
from harness import Run, Stopwatch
from harness import sandbox as sandbox_of  # bench/harness.py: the script's folder is on sys.path

NAMESPACE = "bench"


def pod(i: int) -> dict[str, Any]:
    labels = {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": f"user-{i % 50}",
              "gpu-offload.io/run-id": f"run-{i:06d}", "gpu-offload.io/kernel": f"kernel-{i % 7}"}
    container = {"name": "runner", "image": "python:3.11-slim", "command": ["python3", "/bundle/runner.pyz"],
                 "env": [{"name": "GPU_OFFLOAD_NONCE", "value": "0" * 32}],
                 "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "2", "memory": "8Gi"}},
                 "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
                 "volumeMounts": [{"name": "bundle", "mountPath": "/bundle", "readOnly": True}]}
    return {"metadata": {"name": f"gpuo-{i:06d}", "labels": labels},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "volumes": [{"name": "bundle", "secret": {"secretName": f"gpuo-{i:06d}"}}],
                     "tolerations": [{"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists",
                                      "effect": "NoExecute"}]}}


def client_watch(core: Any, count: int) -> Iterator[Any]:
    watcher = kubernetes.watch.Watch(return_type="object")
    for n, event in enumerate(watcher.stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=60), 1):
        yield event
        if n == count:
            watcher.stop()


def watch_stream(core: Any, count: int) -> Iterator[Any]:
    stream = WatchStream(f"Pods in {NAMESPACE}")
    for n, event in enumerate(stream.events(core.list_namespaced_pod, NAMESPACE, timeout_seconds=60), 1):
        yield event
        if n == count:
            stream.stop()


def measure(read: Callable[[Any, int], Iterator[Any]], core: Any, count: int) -> float:
    """Reading-thread CPU microseconds per event."""
    watch = Stopwatch()
    seen = sum(1 for event in read(core, count) if event["object"]["metadata"]["name"])
    assert seen == count, seen
    return watch.thread_cpu_ms / count * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with sandbox_of() as sandbox:
        client = sandbox.api_client()
        core = kubernetes.client.CoreV1Api(client)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        for i in range(args.pods):
            core.create_namespaced_pod(NAMESPACE, pod(i))
        variants = {"kubernetes.watch.Watch(return_type=\"object\")": client_watch, "WatchStream": watch_stream}
        figures: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):  # alternate, so load from other processes hits both alike
            for name, read in variants.items():
                figures[name].append(measure(read, core, args.pods))
        client.close()
    run = Run("watch", "Client CPU per watch event: the official client's Watch against WatchStream")
    run.note(f"events per round: {args.pods}, rounds: {args.rounds}, alternating; the reading thread's CPU")
    for name, values in figures.items():
        run.figure(f"{name}: CPU per event", values, "us")
    run.write()


if __name__ == "__main__":
    main()
