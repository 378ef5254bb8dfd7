"""What the ``kubernetes step`` command of ``python flow.py run`` gets that the mutator cannot give.

The mutator runs before the run exists, so it cannot label the run; the run id is known when Metaflow's
local runtime builds the ``kubernetes step`` command for a task. ``add_run_label`` rewrites that
command's ``--labels`` there (Argo labels its pods with the workflow itself).

``add_node_lost_tolerations`` gives the step's pod the short toleration of a lost node that the kernel's
runner pods have. Only here: this command's process builds the pod with the Kubernetes client, which takes
the snake_case ``toleration_seconds``; ``argo-workflows create`` copies ``@kubernetes``' tolerations into the
workflow as they are, where that key is unknown and dropped, which would leave a toleration without a limit
(a pod never evicted from a lost node), and Metaflow's decorator refuses the camelCase key.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from .kubernetes_args import RUN_LABEL, label_value

INTERNAL_DECORATOR = "gpu_offload_internal"
"""Name of the small step decorator that calls these (``_internal``: Metaflow hides it)."""


def _is_kubernetes_step(commands: list[str]) -> bool:
    return commands[:2] == ["kubernetes", "step"]


def add_run_label(commands: list[str], command_options: MutableMapping[str, Any]) -> None:
    """Add the run id to the labels of a ``kubernetes step`` command (other commands are left alone)."""
    run_id = command_options.get("run-id")
    if not _is_kubernetes_step(commands) or not run_id:
        return
    labels = json.loads(command_options.get("labels") or "{}")
    labels[RUN_LABEL] = label_value(str(run_id))
    command_options["labels"] = json.dumps(labels)


def add_node_lost_tolerations(commands: list[str], command_options: MutableMapping[str, Any], seconds: int) -> None:
    """Add to a ``kubernetes step`` command's ``--tolerations`` a toleration of a not-ready and of an unreachable
    node for ``seconds`` (``GPU_OFFLOAD_NODE_LOST_SECONDS``): without them Kubernetes gives the pod 300 s on a
    donor that stopped answering before evicting it, so the step and the run would hang five minutes before
    failing (or Metaflow's ``@retry`` trying again). A taint the user's own tolerations name is left to them."""
    if not _is_kubernetes_step(commands):
        return
    # here, not at the top: a step's pod imports this module (through the mutator) from the code package,
    # which carries liqo_peering's labels and settings only; this runs in the `run` process
    from gpu_offload.liqo_peering.specs import node_lost_tolerations

    tolerations = json.loads(command_options.get("tolerations") or "[]")
    theirs = {t.get("key") for t in tolerations}
    for ours in node_lost_tolerations(seconds):
        if ours["key"] not in theirs:
            # the Kubernetes client's attribute names, which `kubernetes step` passes to V1Toleration
            tolerations.append({("toleration_seconds" if k == "tolerationSeconds" else k): v for k, v in ours.items()})
    command_options["tolerations"] = json.dumps(tolerations)
