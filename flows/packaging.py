"""Files ``@gpu_offload`` adds to a flow's code package, so its pod can run the mutator again offline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

FLOWS_DIR = Path(__file__).resolve().parent
LIQO_DIR = FLOWS_DIR.parent / "liqo_peering"
# Only what the mutator imports inside the pod: the decision is recorded there, so no client, no inventory.
LIQO_FILES = ("__init__.py", "labels.py", "environment.py", "settings.py")


def code_package_files() -> Iterator[tuple[str, str, Any]]:
    """``(path, arcname, ContentType.CODE_CONTENT)`` for gpu_offload.flows and the label and setting names it uses."""
    from metaflow.packaging_sys import ContentType

    code = ContentType.CODE_CONTENT
    for path in sorted(FLOWS_DIR.glob("*.py")):
        yield str(path), f"gpu_offload/flows/{path.name}", code
    for name in LIQO_FILES:
        yield str(LIQO_DIR / name), f"gpu_offload/liqo_peering/{name}", code
