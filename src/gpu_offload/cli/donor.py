"""``gpu-offload donor check``: run by a donor cluster's admin, with the donor's kubeconfig, after peering.

Liqo runs an origin's offloaded pods on the donor in *twin* namespaces it creates there (each annotated
``liqo.io/managed-by-namespace-map`` and labelled ``liqo.io/remote-cluster-id`` with the origin's cluster id).
The origin's pods must not run with less isolation than the origin expects (its chart's
``userNamespaces.podSecurity``; the donor chart's ``lending.podSecurity``), so every twin namespace must
enforce at least that Pod Security level. One line per twin namespace, OK or FAIL with the fix; exit 1 on a
FAIL. Before any namespace is offloaded there is nothing to check, which is said (WARN), not hidden.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..liqo_peering.gpu_labels import POD_SECURITY_ORDER, pod_security_shortfall

MANAGED_BY = "liqo.io/managed-by-namespace-map"
"""Liqo's annotation on every twin namespace it creates on a donor (``pkg/consts`` of liqotech/liqo)."""
REMOTE_CLUSTER_ID = "liqo.io/remote-cluster-id"
"""Liqo's label on a twin namespace: the cluster id of the origin whose pods it holds."""


@dataclass(frozen=True)
class Line:
    """One line of the report."""

    status: str
    """``OK``, ``WARN`` or ``FAIL``."""
    namespace: str
    origin: str
    text: str


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``donor`` (with its one action, ``check``) on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("donor", help=summary, description=__doc__)
    parser.add_argument("action", choices=("check",), help="check: the Pod Security of Liqo's twin namespaces")
    parser.add_argument("--expect", choices=POD_SECURITY_ORDER[1:], default="baseline",
                        help="the level the origin expects (its userNamespaces.podSecurity; default: baseline)")
    parser.add_argument("--origin", metavar="CLUSTER_ID",
                        help="check only the namespaces of this origin (default: every origin peered here)")
    parser.add_argument("--context", help="kubeconfig context of the donor cluster (default: the current one)")
    parser.add_argument("--json", action="store_true",
                        help='one JSON object: {"lines": [{"status", "namespace", "origin", "text"}], "failed": N}')
    parser.set_defaults(func=run)


def twin_namespaces(namespaces: Sequence[Mapping[str, Any]], origin: str | None) -> list[Mapping[str, Any]]:
    """The namespaces Liqo created on this donor for an origin (``origin``'s only, when given). A namespace
    that merely carries Liqo's label (a tenant namespace, one an admin labelled) holds no offloaded pod."""
    twins = []
    for namespace in namespaces:
        meta = namespace.get("metadata") or {}
        if MANAGED_BY not in (meta.get("annotations") or {}):
            continue
        if origin is not None and (meta.get("labels") or {}).get(REMOTE_CLUSTER_ID) != origin:
            continue
        twins.append(namespace)
    return twins


def report(namespaces: Sequence[Mapping[str, Any]], expected: str, origin: str | None) -> list[Line]:
    """The report's lines for the donor's namespaces (pure)."""
    twins = twin_namespaces(namespaces, origin)
    if not twins:
        whose = f"origin {origin}" if origin else "any origin"
        return [Line("WARN", "-", origin or "-", f"no namespace offloaded here by {whose} yet (none annotated "
                     f"{MANAGED_BY}): nothing to check; run this again once the origin has offloaded a namespace")]
    lines = []
    for namespace in twins:
        meta = namespace.get("metadata") or {}
        name = str(meta.get("name", "?"))
        from_origin = str((meta.get("labels") or {}).get(REMOTE_CLUSTER_ID, "?"))
        shortfall = pod_security_shortfall(namespace, expected)
        if shortfall is None:
            level = (meta.get("labels") or {}).get("pod-security.kubernetes.io/enforce")
            lines.append(Line("OK", name, from_origin, f"enforces {level} (at least {expected})"))
        else:
            lines.append(Line("FAIL", name, from_origin, f"{shortfall}: kubectl label namespace {name} --overwrite "
                              f"pod-security.kubernetes.io/enforce={expected}"))
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the report; 1 when a line failed or the cluster cannot be read."""
    import kubernetes

    from ..liqo_peering.client import api_client_from_environment
    from ..liqo_peering.errors import GpuOffloadError

    try:
        api = api_client_from_environment(args.context)
        listed = kubernetes.client.CoreV1Api(api).list_namespace(_request_timeout=15, _preload_content=False)
    except GpuOffloadError as exc:
        print(f"gpu-offload donor check: {exc}", file=sys.stderr)
        return 1
    except kubernetes.client.ApiException as exc:
        print(f"gpu-offload donor check: listing namespaces was refused ({exc.status} {exc.reason}); run it with "
              "the donor admin's kubeconfig (it reads Namespaces cluster-wide)", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, TLS: all mean the same to the user
        print(f"gpu-offload donor check: the donor's API server cannot be reached ({type(exc).__name__}); is "
              "KUBECONFIG (or --context) the donor cluster's?", file=sys.stderr)
        return 1
    lines = report(json.loads(listed.data).get("items", []), args.expect, args.origin)
    failed = sum(line.status == "FAIL" for line in lines)
    if args.json:
        print(json.dumps({"lines": [dataclasses.asdict(line) for line in lines], "failed": failed}, indent=2))
    else:
        for line in lines:
            print(f"{line.status:<5} {line.namespace:<30} {line.text}")
    return 1 if failed else 0
