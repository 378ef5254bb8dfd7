"""The run-id label of a step pod launched by ``python flow.py run``.

The mutator runs before the run exists, so it cannot label the run; the run id is known when Metaflow's
local runtime builds the ``kubernetes step`` command for a task. ``add_run_label`` rewrites that
command's ``--labels`` there (Argo labels its pods with the workflow itself).
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

from .kubernetes_args import RUN_LABEL, label_value

INTERNAL_DECORATOR = "gpu_offload_internal"
"""Name of the small step decorator that calls ``add_run_label`` (``_internal``: Metaflow hides it)."""


def add_run_label(commands: list[str], command_options: MutableMapping[str, Any]) -> None:
    """Add the run id to the labels of a ``kubernetes step`` command (other commands are left alone)."""
    run_id = command_options.get("run-id")
    if commands[:2] != ["kubernetes", "step"] or not run_id:
        return
    labels = json.loads(command_options.get("labels") or "{}")
    labels[RUN_LABEL] = label_value(str(run_id))
    command_options["labels"] = json.dumps(labels)
