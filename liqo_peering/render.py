"""Inventory as a plain-text table (``gpu-offload clusters``) and as HTML (the notebook's ``_repr_html_``)."""

from __future__ import annotations

import html

from .inventory import ClusterRecord, Inventory, VirtualNodeRecord

HEADERS = ("CLUSTER", "HEALTH", "TRUST", "VIRTUAL NODE", "MODEL", "MEMORY", "FREE/ALLOC", "IN USE", "$/GPU-H", "STATE")


def node_state(vn: VirtualNodeRecord) -> str:
    """One word for whether placement may use the node."""
    if not vn.ready:
        return "not ready"
    return "cordoned" if vn.cordoned else "ready"


def _row(cluster: ClusterRecord, vn: VirtualNodeRecord | None) -> tuple[str, ...]:
    # trust is the origin's setting (see trust.py); untrusted donors get outputs back only as safe types
    head = (cluster.name, cluster.health, "trusted" if cluster.trusted else "untrusted")
    if vn is None:
        return (*head, "-", "-", "-", "-", "-", "-", "-")
    price = "-" if vn.price is None else f"{vn.price:g}"
    return (
        *head,
        vn.name,
        vn.model or "?",
        vn.memory or "?",
        f"{vn.free}/{vn.allocatable}",
        str(vn.in_use),
        price,
        node_state(vn),
    )


def rows(inventory: Inventory) -> list[tuple[str, ...]]:
    """One row per virtual node; a cluster without virtual nodes gets one row of dashes."""
    out: list[tuple[str, ...]] = []
    for cluster in inventory.clusters:
        out.extend(_row(cluster, vn) for vn in cluster.virtual_nodes or (None,))
    return out


def _notes(inventory: Inventory) -> list[str]:
    notes = [f"{c.name} is {c.health}: {c.reason}" for c in inventory.clusters if c.reason]
    return notes + [f"skipped: {e}" for e in inventory.errors]


def render_table(inventory: Inventory) -> str:
    """Aligned plain text, then one line per unhealthy cluster naming its failing condition."""
    if not inventory.clusters:
        return "No peered clusters. Peer one with `liqoctl peer` (see the README) and list again."
    table = [HEADERS, *rows(inventory)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines + _notes(inventory))


def render_html(inventory: Inventory) -> str:
    """The same table as HTML; every value is escaped (labels are user-controlled)."""
    if not inventory.clusters:
        return f"<p>{html.escape(render_table(inventory))}</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in r) + "</tr>" for r in rows(inventory)
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in _notes(inventory))
    notes_html = f"<ul>{notes}</ul>" if notes else ""
    return f'<table class="gpu-offload-clusters"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes_html}'
