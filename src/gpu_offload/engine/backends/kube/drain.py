"""What a warm session does when its donor is being drained (pure).

A drain starts with a cordon: ``kubectl cordon``, or Liqo cordoning the virtual node of a donor whose share is
being taken back, sets the node's ``spec.unschedulable``, and the evictions follow. A session whose pod (or a
distributed session's pod) sits on a cordoned node is moved before that pod is evicted (checkpoint, then restore
on another donor: the move path of ``%gpu_offload move``): by the kernel's drain watch while it idles, else by its
next cell before that cell runs, rather than starting work on a node about to be emptied. Whether another donor
has room is asked of placement itself (``plan.choose_nodes``: one fit rule, which already skips a cordoned node).
When no other donor has room it stays where it is and says the donor is being drained; when it is not
checkpointed it cannot move without losing its variables, and says that too.

A cell's pod that waits on a cordoned node before its runner started (pulling its image, or pending on the donor)
has nothing to lose: it moves to another donor that placement finds room on (:func:`waiting_step`), through the one
retry elsewhere a run gets; with no other donor it waits there, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ....liqo_peering.errors import PlacementError
from ....liqo_peering.inventory import Inventory
from ..base import RunRequest
from .plan import choose_nodes


@dataclass(frozen=True)
class DrainStep:
    """The step for a session whose node is cordoned."""

    move: bool
    """Move the session before the cell (checkpoint, restore elsewhere); else the cell runs where it is."""
    why: str
    """``donor X is being drained (its node N is cordoned)``: the reason said either way."""
    text: str = ""
    """What the cell is told when the session stays (empty when it moves: the move's own lines say it)."""
    idle: str = field(default="", compare=False)
    """What ``%gpu_offload sessions`` says of an idle session that stays (empty when it moves)."""


def _drained(nodes: set[str], inventory: Inventory) -> str | None:
    """``donor X is being drained (its node N is cordoned)`` for the first of ``nodes`` that is cordoned, else None."""
    here = next(((c, vn) for c in inventory.clusters for vn in c.virtual_nodes
                 if vn.name in nodes and vn.cordoned), None)
    if here is None:
        return None
    return f"donor {here[0].name} is being drained (its node {here[1].name} is cordoned)"


def _room_elsewhere(request: RunRequest, inventory: Inventory, policy: str, memory: str | None) -> bool:
    try:  # placement skips cordoned nodes, clusters that are down and nodes not ready
        choose_nodes(request, inventory, policy, memory)
    except PlacementError:
        return False
    return True


def waiting_step(node: str, request: RunRequest, inventory: Inventory, policy: str = "most-free",
                 memory: str | None = None) -> DrainStep | None:
    """The step for a pod that waits on ``node`` before its runner started, or ``None`` when ``node`` is not
    cordoned: move when placement finds room for ``request`` elsewhere (nothing ran, nothing is lost), else wait
    there. ``policy`` and ``memory`` as for :func:`drain_step`."""
    why = _drained({node}, inventory)
    if why is None:
        return None
    if _room_elsewhere(request, inventory, policy, memory):
        return DrainStep(True, why)
    return DrainStep(False, why, (
        f"{why}, and no other donor has room for this cell ({request.shape()}): its pod waits there; if the drain "
        "evicts it before it starts, run the cell again"))


def drain_step(node: str | Iterable[str], request: RunRequest, inventory: Inventory, not_kept: str | None,
               policy: str = "most-free", memory: str | None = None) -> DrainStep | None:
    """The step for a session whose pod runs on ``node`` (a distributed session's pods: on these nodes) and asked
    ``request``, or ``None`` when none of its nodes is cordoned (or in ``inventory``). ``not_kept``: why the
    session is not checkpointed (``None``: it is). ``policy`` and ``memory``: the kernel's placement policy and
    the pod's memory, as its launch is placed (``memory`` decides the room; the policy only ranks)."""
    why = _drained({node} if isinstance(node, str) else set(node), inventory)
    if why is None:
        return None
    if not_kept is not None:
        return DrainStep(False, why, (
            f"{why}: this session's pod will be evicted, and the session is not checkpointed ({not_kept}), so it "
            "cannot move without losing its variables and they go when the pod does; the cell runs there"),
            f"{why}: not checkpointed ({not_kept}), it stays, and its variables go when its pod is evicted")
    if not _room_elsewhere(request, inventory, policy, memory):
        return DrainStep(False, why, (
            f"{why}, and no other donor has room for this session ({request.shape()}): the cell runs there; when "
            "its pod is evicted the session's state is checkpointed and its next cell resumes it elsewhere"),
            f"{why}, and no other donor has room for it ({request.shape()}): it stays until its pod is evicted; "
            "its next cell then resumes it from its checkpoint")
    return DrainStep(True, why)
