"""The admin pages as HTML strings, from the view records. Pure: every value is escaped here.

Plain server-rendered HTML with forms: works without JavaScript, and every write goes through a
confirmation page carrying JupyterHub's XSRF token.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence

from gpu_offload.liqo_peering.inventory import VirtualNodeRecord

from .store import AuditEntry, UsageTotal
from .views import ClusterDetail, ClusterRow

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}
th{background:#f3f3f3}.down{color:#b00}.degraded{color:#a60}.healthy{color:#070}.cordoned{color:#b00;font-weight:bold}
nav a{margin-right:1rem}.ok{background:#e8f5e9;padding:.6rem}.fail{background:#fdecea;padding:.6rem}
form.inline{display:inline}code{background:#f3f3f3;padding:.1rem .3rem}
"""


def e(value: object) -> str:
    """HTML-escaped text of ``value`` (``-`` for None)."""
    return "-" if value is None else html.escape(str(value))


def age(seconds: float | None) -> str:
    """An age the way kubectl prints it: 45s, 12m, 3h, 5d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(max(seconds, 0))}s"


def layout(title: str, body: str, prefix: str, user: str) -> str:
    """A full page with the navigation bar."""
    nav = "".join(f'<a href="{e(prefix)}{href}">{label}</a>' for href, label in
                  (("", "Clusters"), ("users", "Users"), ("audit", "Audit log")))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)} - GPU offload</title>"
            f"<style>{_STYLE}</style></head><body><nav>{nav}<span>signed in as {e(user)}</span></nav>"
            f"<h1>{e(title)}</h1>{body}</body></html>")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table whose cells are already HTML."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def action_form(prefix: str, kind: str, fields: Mapping[str, str], label: str, xsrf: str,
                inputs: str = "") -> str:
    """A form posting to an action (hidden ``fields`` plus visible ``inputs``); the next page confirms it."""
    hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in fields.items())
    return (f'<form class="inline" method="post" enctype="multipart/form-data" action="{e(prefix)}actions/{e(kind)}">'
            f'{xsrf}{hidden}{inputs}<button type="submit">{e(label)}</button></form>')


def _price(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _cluster_cells(row: ClusterRow, prefix: str) -> list[str]:
    modules = "<br>".join(f"{e(m)}: {e(s)}" for m, s in row.modules)
    state = f'<span class="cordoned">{row.cordoned} cordoned</span>' if row.cordoned else "schedulable"
    return [
        f'<a href="{e(prefix)}clusters/{e(row.cluster_id)}">{e(row.name)}</a>', e(row.role),
        f'<span class="{e(row.health)}">{e(row.health)}</span> {e(row.reason)}', modules, age(row.age_seconds),
        str(row.gpus_total), str(row.gpus_free), str(row.gpus_in_use), _price(row.price), state,
    ]


def clusters_page(rows: Sequence[ClusterRow], prefix: str, can_manage: bool, xsrf: str) -> str:
    """Every peered cluster with its GPUs, and (for operators) the peering form."""
    headers = ("Cluster", "Role", "Health", "Modules", "Age", "GPUs total", "GPUs free", "GPUs in use",
               "Price/GPU-h", "Cordon")
    body = table(headers, (_cluster_cells(r, prefix) for r in rows)) if rows else "<p>No peered clusters.</p>"
    if can_manage:
        inputs = ('<label>cluster id <input name="cluster_id" required></label> '
                  '<label>its kubeconfig <input type="file" name="kubeconfig"></label> ')
        body += ("<h2>Peering</h2>" + action_form(prefix, "peer", {}, "Peer…", xsrf, inputs) + " "
                 + action_form(prefix, "unpeer", {}, "Unpeer…", xsrf, inputs))
    return body


def _node_cells(vn: VirtualNodeRecord, prefix: str, can_manage: bool, xsrf: str) -> list[str]:
    state = "not ready" if not vn.ready else ('<span class="cordoned">cordoned</span>' if vn.cordoned else "ready")
    cells = [e(vn.name), e(vn.model), e(vn.memory), str(vn.capacity), str(vn.free), str(vn.in_use),
             _price(vn.price), state]
    if can_manage:
        kind = "uncordon" if vn.cordoned else "cordon"
        fields = {"cluster_id": vn.cluster_id, "node": vn.name}
        label_inputs = (f'<input name="model" size="8" placeholder="model" value="{e(vn.model or "")}">'
                        f'<input name="price" size="5" placeholder="price" value="{_price(vn.price).strip("-")}">')
        cells.append(action_form(prefix, kind, fields, kind.capitalize() + "…", xsrf) + " "
                     + action_form(prefix, "label", fields, "Set labels…", xsrf, label_inputs))
    return cells


def cluster_page(detail: ClusterDetail, prefix: str, can_manage: bool, xsrf: str) -> str:
    """One cluster: its virtual nodes, ResourceSlices and offloaded pods, with the node and slice actions."""
    row = detail.row
    headers = ["Virtual node", "GPU model", "GPU memory", "GPUs", "Free", "In use", "Price/GPU-h", "State"]
    if can_manage:
        headers.append("Actions")
    parts = [
        f'<p>Cluster id <code>{e(row.cluster_id)}</code>, role {e(row.role)}, health '
        f'<span class="{e(row.health)}">{e(row.health)}</span> {e(row.reason)}</p>',
        "<h2>Virtual nodes</h2>",
        table(headers, (_node_cells(vn, prefix, can_manage, xsrf) for vn in detail.virtual_nodes)),
        "<h2>ResourceSlices</h2>",
        table(("Namespace", "Name", "GPUs requested", "GPUs granted", "Conditions"),
              ([e(s.namespace), e(s.name), e(s.requested_gpus), e(s.granted_gpus), e(s.conditions)]
               for s in detail.slices)),
    ]
    if can_manage:
        inputs = ('<label>name <input name="name" placeholder="' + e(f"{row.cluster_id}-gpu") + '"></label> '
                  '<label>GPUs <input name="gpus" size="4" required></label> ')
        parts.append(action_form(prefix, "resourceslice", {"cluster_id": row.cluster_id},
                                 "Request or resize…", xsrf, inputs))
    parts += ["<h2>Offloaded pods</h2>",
              table(("Namespace", "Pod", "User", "Virtual node", "GPUs", "Phase", "Age"),
                    ([e(p.namespace), e(p.name), e(p.user), e(p.node), str(p.gpus), e(p.phase), age(p.age_seconds)]
                     for p in detail.pods))]
    return "".join(parts)


def users_page(totals: Sequence[UsageTotal]) -> str:
    """GPU-hours per user and cluster."""
    if not totals:
        return "<p>No finished offloaded runs recorded yet.</p>"
    return table(("User", "Cluster", "Runs", "GPU-hours"),
                 ([e(t.user), e(t.cluster_id), str(t.runs), f"{t.gpu_hours:.3f}"] for t in totals))


def audit_page(entries: Sequence[AuditEntry]) -> str:
    """The most recent admin actions."""
    if not entries:
        return "<p>No actions yet.</p>"
    return table(("When (UTC)", "Who", "Action", "Target", "Result"),
                 ([e(a.at.strftime("%Y-%m-%d %H:%M:%S")), e(a.who), e(a.action), e(a.target),
                   ("" if a.ok else "FAILED: ") + e(a.result)] for a in entries))


def confirm_page(prefix: str, kind: str, description: str, fields: Mapping[str, str], xsrf: str) -> str:
    """Ask before doing: the action in words, and a button that submits it again with ``confirm=yes``."""
    hidden = {**fields, "confirm": "yes"}
    return (f"<p>You are about to <strong>{e(description)}</strong>.</p>"
            + action_form(prefix, kind, hidden, "Confirm", xsrf)
            + f' <a href="{e(prefix)}">Cancel</a>')


def result_page(ok: bool, message: str, prefix: str, command: str = "") -> str:
    """What happened, in words."""
    extra = f"<p>Command:</p><pre><code>{e(command)}</code></pre>" if command else ""
    return (f'<div class="{"ok" if ok else "fail"}" id="result">{e(message)}</div>{extra}'
            f'<p><a href="{e(prefix)}">Back to the clusters</a></p>')
