"""Which uploaded kubeconfigs the hub accepts for peering. Pure: no I/O here.

liqoctl runs in the hub pod with the hub's account. A kubeconfig is code and file access there, not just
data: an ``exec`` plugin or ``auth-provider`` runs a program, ``tokenFile`` and the certificate/key file
fields read files of the hub pod. So only self-contained kubeconfigs pass: a server, inline certificates
and a bearer token (or inline client certificate, or basic auth); every other field is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from gpu_offload.liqo_peering.errors import InvalidRequest

MAX_BYTES = 64 * 1024
"""A kubeconfig is a few KiB; the cap keeps an upload from filling the service's memory."""

USER_FIELDS = frozenset({"token", "client-certificate-data", "client-key-data", "username", "password"})
CLUSTER_FIELDS = frozenset({"server", "certificate-authority-data", "insecure-skip-tls-verify", "tls-server-name"})

HOW_TO = (
    "upload a self-contained token kubeconfig instead: on the remote cluster create a ServiceAccount with the "
    "rights liqoctl needs, get a token with `kubectl create token NAME --duration=1h`, and write it under "
    "users[].user.token with the API server's CA under clusters[].cluster.certificate-authority-data (the "
    "usual EKS, GKE and AKS kubeconfigs use exec plugins such as aws eks get-token, gke-gcloud-auth-plugin or "
    "kubelogin, which the hub refuses to run)"
)


def _refuse(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"kubeconfig: {where} {what}; {HOW_TO}")


def _entries(doc: Mapping[str, Any], section: str, inner: str) -> list[tuple[str, Mapping[str, Any]]]:
    items = doc.get(section)
    if not isinstance(items, list):
        raise InvalidRequest(f"kubeconfig: no {section} list; upload the remote cluster's kubeconfig "
                             "(a YAML file with clusters:, users: and contexts:)")
    found: list[tuple[str, Mapping[str, Any]]] = []
    for i, item in enumerate(items):
        body = item.get(inner) if isinstance(item, dict) else None
        if not isinstance(body, dict):
            raise InvalidRequest(f"kubeconfig: {section}[{i}] has no {inner}: mapping; fix the file and upload it again")
        found.append((f"{section}[{i}].{inner}", body))
    return found


def _only(where: str, body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    for key in body:
        if key in allowed:
            continue
        if key in ("exec", "auth-provider"):
            raise _refuse(f"{where}.{key}", "runs a program in the hub pod to get credentials")
        if key in ("tokenFile", "client-certificate", "client-key", "certificate-authority"):
            raise _refuse(f"{where}.{key}", "names a file, which would be read in the hub pod")
        raise _refuse(f"{where}.{key}", f"is not accepted (accepted here: {', '.join(sorted(allowed))})")


def check_kubeconfig(text: str) -> str:
    """``text`` when it is a self-contained token kubeconfig; else an InvalidRequest naming the field and the fix."""
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise InvalidRequest(f"kubeconfig: larger than {MAX_BYTES // 1024} KiB; upload only the remote cluster's "
                             "kubeconfig")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, dict):
        raise InvalidRequest("kubeconfig: the uploaded file is not a kubeconfig (a YAML file with clusters: and "
                             "users:); upload the remote cluster's kubeconfig")
    for where, body in _entries(doc, "users", "user"):
        _only(where, body, USER_FIELDS)
    for where, body in _entries(doc, "clusters", "cluster"):
        _only(where, body, CLUSTER_FIELDS)
    return text
