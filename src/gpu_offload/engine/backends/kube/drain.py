"""What a warm session does when its donor is being drained (pure).

A drain starts with a cordon: ``kubectl cordon``, or Liqo cordoning the virtual node of a donor whose share is
being taken back, sets the node's ``spec.unschedulable``, and the evictions follow. A session whose pod sits on a
cordoned node is moved by its next cell before that cell runs (checkpoint, then restore on another donor:
the move path of ``%gpu_offload move``), rather than starting work on a node about to be emptied. When no other
donor has room it runs where it is and says the donor is being drained; when it is not checkpointed it cannot
move without losing its variables, and says that too.

A cell whose pod waits on a cordoned node (bound, its runner not started: pulling its image, or pending on the
donor) has nothing to lose: it moves to another donor that has room (:func:`waiting_step`), through the one retry
elsewhere a run or a session's first pod gets; with no other donor it waits there, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....liqo_peering.inventory import Inventory, VirtualNodeRecord
from ..base import RunRequest


@dataclass(frozen=True)
class DrainStep:
    """The next cell's step for a session whose node is cordoned."""

    move: bool
    """Move the session before the cell (checkpoint, restore elsewhere); else the cell runs where it is."""
    why: str
    """``donor X is being drained (its node N is cordoned)``: the reason said either way."""
    text: str = ""
    """What the cell is told when the session stays (empty when it moves: the move's own lines say it)."""


def _fits(node: VirtualNodeRecord, cluster: str, request: RunRequest) -> bool:
    """Whether the session could be placed on ``node`` of ``cluster``: ready, not cordoned, on a cluster the
    session may use, of a model it takes, with its GPUs free (a part of a GPU needs one with a share free)."""
    if not node.ready or node.cordoned or request.cluster not in ("auto", cluster, node.cluster_id):
        return False
    models = {m.lower() for m in (request.gpu_model, *request.fallback_models) if m}
    if models and (node.model or "").lower() not in models:  # as placement matches models: in any case
        return False
    return node.free >= (1 if request.fraction is not None else request.gpus) or (
        request.fraction is not None and any(a > u for _, a, u in node.devices))


def _cordoned(node: str, inventory: Inventory) -> str | None:
    """``donor X is being drained (its node N is cordoned)`` when ``node`` is cordoned, else None."""
    here = next(((c, vn) for c in inventory.clusters for vn in c.virtual_nodes if vn.name == node), None)
    if here is None or not here[1].cordoned:
        return None
    return f"donor {here[0].name} is being drained (its node {node} is cordoned)"


def _fits_elsewhere(node: str, request: RunRequest, inventory: Inventory) -> bool:
    return any(_fits(vn, c.name, request) for c in inventory.clusters if c.health != "down"
               for vn in c.virtual_nodes if vn.name != node)


def waiting_step(node: str, request: RunRequest, inventory: Inventory) -> DrainStep | None:
    """The step for a pod that waits on ``node`` before its runner started, or ``None`` when ``node`` is not
    cordoned: move when another donor has room for ``request`` (nothing ran, nothing is lost), else wait there."""
    why = _cordoned(node, inventory)
    if why is None:
        return None
    if _fits_elsewhere(node, request, inventory):
        return DrainStep(True, why)
    return DrainStep(False, why, (
        f"{why}, and no other donor has room for this cell ({request.shape()}): its pod waits there; if the drain "
        "evicts it before it starts, run the cell again"))


def drain_step(node: str, request: RunRequest, inventory: Inventory, not_kept: str | None) -> DrainStep | None:
    """The step for a session whose pod runs on ``node`` and asked ``request``, or ``None`` when its node is not
    cordoned (or not in ``inventory``). ``not_kept``: why the session is not checkpointed (``None``: it is)."""
    why = _cordoned(node, inventory)
    if why is None:
        return None
    if not_kept is not None:
        return DrainStep(False, why, (
            f"{why}: this session's pod will be evicted, and the session is not checkpointed ({not_kept}), so it "
            "cannot move without losing its variables and they go when the pod does; the cell runs there"))
    if not _fits_elsewhere(node, request, inventory):
        return DrainStep(False, why, (
            f"{why}, and no other donor has room for this session ({request.shape()}): the cell runs there; when "
            "its pod is evicted the session's state is checkpointed and its next cell resumes it elsewhere"))
    return DrainStep(True, why)
