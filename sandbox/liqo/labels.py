"""VirtualNode ``spec.labels`` to the virtual Node, as Liqo's virtual kubelet carries them.

In Liqo v1 the VirtualNode controller hands ``spec.labels`` to the virtual kubelet it deploys, and the
kubelet puts them on the Node it registers; a change re-deploys the kubelet, so the Node's labels follow
within seconds. The Node has the VirtualNode's name (``<cluster>-gpu`` for the seeded donors), which is how
the two are linked here too.

The rules, kept simple on purpose:

- every key of ``spec.labels`` is set on the Node with its value (added or changed);
- a key that leaves ``spec.labels`` is removed from the Node only if this propagation put it there (set it,
  or found it already equal when it first saw the pair), so labels others set on the Node survive;
- ``liqo.io/*`` keys (and ``*.liqo.io/*``) belong to the virtual kubelet and are never written or removed;
- a Node created after its VirtualNode is brought in step when it appears.

What "put there" covers lives in memory, like the rest of the sandbox's state: a restarted sandbox starts
from the seed again anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from ..apiserver.api import Api
from ..apiserver.errors import ApiError
from ..apiserver.patching import MERGE
from ..apiserver.store import Subscription, WatchEvent

log = logging.getLogger(__name__)


def liqo_owned(key: str) -> bool:
    """Whether a label key belongs to Liqo's virtual kubelet (``liqo.io/...`` or ``<sub>.liqo.io/...``)."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return prefix == "liqo.io" or prefix.endswith(".liqo.io")


def label_patch(wanted: Mapping[str, str], current: Mapping[str, str],
                propagated: set[str]) -> dict[str, str | None]:
    """The label changes (None: remove) that bring ``current`` Node labels in step with ``wanted``.

    ``propagated`` holds the keys this propagation owns on the Node; only those may be removed.
    """
    changes: dict[str, str | None] = {k: str(v) for k, v in wanted.items()
                                      if not liqo_owned(k) and current.get(k) != str(v)}
    changes.update({k: None for k in propagated if k not in wanted and k in current and not liqo_owned(k)})
    return changes


class LabelPropagator:
    """Keeps each virtual Node's labels in step with its VirtualNode's ``spec.labels``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self._wanted: dict[str, dict[str, str]] = {}  # node name -> spec.labels last seen
        self._propagated: dict[str, set[str]] = {}  # node name -> keys this propagation owns on the Node

    def virtual_node_changed(self, vnode: Mapping[str, Any], deleted: bool = False) -> None:
        """A VirtualNode was created, changed or deleted: follow its labels onto its Node."""
        name = vnode["metadata"]["name"]
        if deleted:
            self._wanted.pop(name, None)
            return
        self._wanted[name] = dict((vnode.get("spec") or {}).get("labels") or {})
        self.sync(name)

    def node_changed(self, node: Mapping[str, Any], event_type: str) -> None:
        """A Node appeared (brought in step) or went (its ownership record is dropped)."""
        name = node["metadata"]["name"]
        if event_type == "DELETED":
            self._propagated.pop(name, None)
        elif event_type == "ADDED" and name in self._wanted:
            self.sync(name)

    def sync(self, name: str) -> None:
        """Patch Node ``name`` so its labels follow the VirtualNode of the same name."""
        node_rt = self.api.type("", "v1", "nodes")
        node = self.api.find(node_rt, "", name)
        if node is None:
            return  # the Node is brought in step when it appears
        wanted = self._wanted.get(name, {})
        current = node["metadata"].get("labels") or {}
        changes = label_patch(wanted, current, self._propagated.get(name, set()))
        if changes:
            try:
                self.api.patch(node_rt, "", name, {"metadata": {"labels": changes}}, MERGE)
            except ApiError as exc:
                # a real virtual kubelet would crash-loop on such labels; the sandbox says why and goes on
                log.warning("VirtualNode %s: its spec.labels could not be put on Node %s (%s); "
                            "fix the labels on the VirtualNode", name, name, exc)
                return
        # every wanted key now sits on the Node as wanted; nothing else is ours any more
        self._propagated[name] = {k for k in wanted if not liqo_owned(k)}


async def _follow(sub: Subscription, handle: Any) -> None:
    try:
        async for event in sub:
            handle(event)
    finally:
        sub.close()


async def label_controller(api: Api) -> None:
    """Propagate every VirtualNode's labels now and on each change; never returns."""
    propagator = LabelPropagator(api)
    vn_rt = api.kind("offloading.liqo.io/v1beta1", "VirtualNode")
    node_key = api.type("", "v1", "nodes").key
    items, rv = api.store.list(vn_rt.key)
    for obj in items:
        with contextlib.suppress(ApiError):
            propagator.virtual_node_changed(obj)
    vn_sub = api.store.subscribe(vn_rt.key, since=rv)
    node_sub = api.store.subscribe(node_key, since=rv)

    def on_vnode(event: WatchEvent) -> None:
        propagator.virtual_node_changed(event.object, deleted=event.type == "DELETED")

    def on_node(event: WatchEvent) -> None:
        propagator.node_changed(event.object, event.type)

    await asyncio.gather(_follow(vn_sub, on_vnode), _follow(node_sub, on_node))
