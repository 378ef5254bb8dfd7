"""An offline inventory: the clusters and GPUs a deployment may use, from a JSON file.

Used where no cluster is reachable when the flow is validated (CI building Argo templates, a laptop), so
that an unknown cluster or a model nobody offers is still caught before anything is deployed. The format:

    {"clusters": [{"id": "donor-a", "name": "donor-a",
                   "virtual_nodes": [{"name": "liqo-donor-a", "gpus": 4, "model": "A100"}]}]}

Free GPUs are not known offline: every listed GPU counts as free. A donor that shares its GPUs says how, as its
labeller does on a live cluster, so a step can ask for part of a GPU in its units (docs/sharing.md): ``gpus`` is
then what the node offers as ``nvidia.com/gpu`` (0 when its shares are renamed), and

    {"name": "liqo-donor-t", "gpus": 0, "model": "A100", "memory": "80Gi", "sharing": "time-slicing",
     "replicas": 4, "resources": {"nvidia.com/gpu.shared": 8}}

``memory`` is one GPU's, ``sharing`` one of none, time-slicing, mps, mig, memory, and ``resources`` the node's
other ``nvidia.com/`` resources (shares, MIG profiles, an isolator's MiB).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import GpuOffloadFlowError

if TYPE_CHECKING:
    from gpu_offload.liqo_peering.inventory import ClusterRecord, Inventory, VirtualNodeRecord

FORMAT_HINT = 'expected {"clusters": [{"id": ..., "virtual_nodes": [{"name": ..., "gpus": 4, "model": "A100"}]}]}'


def _cluster(path: str, raw: Any) -> ClusterRecord:
    from gpu_offload.liqo_peering.inventory import ClusterRecord, VirtualNodeRecord

    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not raw["id"]:
        raise GpuOffloadFlowError(f"inventory {path}: cluster entry {raw!r} has no 'id'; {FORMAT_HINT}")
    cid = raw["id"]
    nodes = []
    for node in raw.get("virtual_nodes") or []:
        gpus = node.get("gpus") if isinstance(node, dict) else None
        if not isinstance(node, dict) or not node.get("name") or isinstance(gpus, bool) or not isinstance(gpus, int):
            raise GpuOffloadFlowError(
                f"inventory {path}: virtual node {node!r} of cluster {cid!r} needs a 'name' and an integer "
                f"'gpus'; {FORMAT_HINT}"
            )
        nodes.append(_sharing_node(path, cid, VirtualNodeRecord(str(node["name"]), cid, gpus, gpus, 0,
                                                                model=node.get("model")), node))
    return ClusterRecord(cid, str(raw.get("name") or cid), "Provider", "healthy", "", tuple(nodes))


def _sharing_node(path: str, cid: str, record: VirtualNodeRecord, node: dict[str, Any]) -> VirtualNodeRecord:
    """``record`` with how its donor shares GPUs, when the entry says so; raises naming the bad key."""
    import dataclasses

    if not any(key in node for key in ("memory", "sharing", "replicas", "resources")):
        return record
    resources = node.get("resources") or {}
    replicas = node.get("replicas", 1)
    where = f"inventory {path}: virtual node {record.name!r} of cluster {cid!r}"
    if (not isinstance(resources, dict) or not all(isinstance(r, str) and r.startswith("nvidia.com/")
                                                   and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                   for r, n in resources.items())):
        raise GpuOffloadFlowError(f"{where}: 'resources' must map nvidia.com/ resources to counts, e.g. "
                                  '{"nvidia.com/gpu.shared": 8}')
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise GpuOffloadFlowError(f"{where}: 'replicas' must be an integer number of shares per GPU")
    devices = {**({"nvidia.com/gpu": record.capacity} if record.capacity else {}), **resources}
    found = dataclasses.replace(record, memory=str(node["memory"]) if node.get("memory") else None,
                                sharing=str(node.get("sharing", "none")), replicas=replicas,
                                devices=tuple((r, n, 0) for r, n in devices.items()))
    try:
        found.offer()  # the same checks as a live node's labels: the mode, the replicas, the memory
    except ValueError as exc:
        raise GpuOffloadFlowError(f"inventory {path}: {exc}") from exc
    return found


def load_inventory(path: str) -> Inventory:
    """The inventory described by the JSON file at ``path``; raises naming the file and the bad entry."""
    from gpu_offload.liqo_peering.inventory import Inventory

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise GpuOffloadFlowError(
            f"inventory {path}: cannot read it ({exc.strerror}); fix METAFLOW_GPU_OFFLOAD_INVENTORY or unset it"
        ) from exc
    except ValueError as exc:
        raise GpuOffloadFlowError(f"inventory {path}: not valid JSON ({exc}); {FORMAT_HINT}") from exc
    clusters = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(clusters, list):
        raise GpuOffloadFlowError(f"inventory {path}: no 'clusters' list; {FORMAT_HINT}")
    from gpu_offload.liqo_peering.trust import apply_policy, policy_from_env

    # trust from the origin's own setting, as for a live inventory; never from the file's clusters
    return apply_policy(Inventory(tuple(_cluster(path, c) for c in clusters)), policy_from_env(os.environ))
