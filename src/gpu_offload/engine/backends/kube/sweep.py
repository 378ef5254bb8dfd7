"""The orphan sweep: a Jupyter server deletes the runner pods of kernels it no longer has.

A kernel deletes its pods when a cell ends, on Ctrl-C and at exit, and a restarted kernel (same id) removes
what its crashed predecessor left. What none of that covers is a kernel killed and then shut down, or a
server that died with its kernels: their pods would hold GPUs until their ``--timeout``, or for ever. The
runs server extension knows which kernels are alive, so it sweeps: every runner pod labelled with this
server whose kernel is not among the live ones goes, with its Secret.

The server's identity (``magics.runs_api.server_identity``) travels to its kernels through the environment
(``GPU_OFFLOAD_SERVER_ID``), so pods made by the CLI (labelled ``gpu-offload.io/origin=cli``, and skipped even
if one carried a server label), by another server of the same user or by a kernel started elsewhere carry no
such label, or another one, and are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ....liqo_peering import labels as L
from ....liqo_peering.specs import label_value, runner_selector
from .pods import PodApi


def orphan_selectors(pod_labels: Iterable[Mapping[str, str]], live: Mapping[str, int | None]) -> set[str]:
    """Selector fragments, one per dead kernel life, for the pods whose kernel is gone.

    ``live`` maps each live kernel id to its process id (None when unknown, as during a restart). A pod is an
    orphan when its kernel is not live, or when it is but under another pid: the kernel crashed, the server
    restarted it with the same id, and the new process knows nothing of the old one's pods.
    """
    live_pids = {label_value(k): None if pid is None else str(pid) for k, pid in live.items()}
    found: set[str] = set()
    for labels in pod_labels:
        kernel, pid = labels.get(L.KERNEL), labels.get(L.KERNEL_PID)
        if not kernel or labels.get(L.ORIGIN) == L.ORIGIN_CLI:
            continue
        if kernel not in live_pids:
            found.add(f"{L.KERNEL}={kernel}")
        elif pid and live_pids[kernel] is not None and pid != live_pids[kernel]:
            found.add(f"{L.KERNEL}={kernel},{L.KERNEL_PID}={pid}")
    return found


class OrphanSweep:
    """One server's sweep; ``sweep()`` is blocking API I/O, run it off the server's event loop."""

    def __init__(self, pods: PodApi, user: str, server: str,
                 live_kernels: Callable[[], Mapping[str, int | None]]) -> None:
        self.pods, self.user, self.server = pods, user, server
        self._live_kernels = live_kernels

    def sweep(self) -> list[str]:
        """Delete the pods and Secrets of this server's dead kernels; returns their names.

        Pods are listed before the live kernels are asked for: a kernel that starts in between cannot have
        a pod in the listing, so a live kernel's pod is never taken for an orphan.
        """
        selector = runner_selector(self.user, server=self.server)
        # a pod already being deleted (perhaps held by the hub meter's finalizer) needs nothing more
        labels = [(pod.get("metadata") or {}).get("labels") or {} for pod in self.pods.list_pods(selector)
                  if not (pod.get("metadata") or {}).get("deletionTimestamp")]
        removed: list[str] = []
        for orphan in sorted(orphan_selectors(labels, self._live_kernels())):
            removed += self.pods.delete_matching(f"{selector},{orphan}")
        return removed
