"""The names a pod resolves, written as its /etc/hosts and /etc/resolv.conf (pure builders).

A cluster resolves these through its DNS (CoreDNS); here they are files the kubelet bind-mounts over the
container's (glibc reads ``files`` before ``dns``), rewritten in place as Services and pods change:

- a Service: ``svc`` (same namespace), ``svc.ns``, ``svc.ns.svc``, ``svc.ns.svc.cluster.local``, to its
  ClusterIP, or for a headless Service (``clusterIP: None``) to the IP of each ready pod it selects (with
  ``publishNotReadyAddresses``, of each pod it selects that has an IP and has not ended, ready or not);
- a pod with ``hostname`` and ``subdomain`` naming a headless Service of its namespace:
  ``host.sub.ns.svc.cluster.local`` (and the shorter forms, as the search list would give them);
- the pod itself, as a kubelet writes it: ``<ip> <hostname>.<subdomain>.<ns>.svc.cluster.local <hostname>``.

A hosts file has no search list, so each short form is written out. resolv.conf names the search list a
kubelet gives and a nameserver on the pod's own loopback that answers "no such name" to everything
(``poddns.py``): a name that is not in the hosts file fails at once, as a cluster's DNS says of a name it
does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DOMAIN = "cluster.local"
HEADER = "# Kubernetes-managed hosts file (gpu-offload sandbox).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@dataclass(frozen=True)
class Entry:
    """One address and the names that reach it, from anywhere (``short`` only from ``namespace``)."""

    ip: str
    names: tuple[str, ...]
    namespace: str
    short: str


def ready(pod: Mapping[str, Any]) -> bool:
    """A pod whose address a Service publishes: it has an IP, is Ready and is not being deleted."""
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def published(service: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``service``'s endpoints (and so its DNS names) carry ``pod``'s address: a ready pod, or with
    ``publishNotReadyAddresses`` any pod with an IP that has not ended, as the EndpointSlice controller
    marks it ready whatever the pod's own readiness (peer discovery before readiness, a Job's rendezvous)."""
    if not (service.get("spec") or {}).get("publishNotReadyAddresses"):
        return ready(pod)
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and status.get("phase") not in ("Succeeded", "Failed")


def selects(service: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """``service`` selects ``pod`` (same namespace, every selector label equal; no selector: none)."""
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and service["metadata"]["namespace"] == pod["metadata"]["namespace"] and all(
        labels.get(k) == v for k, v in selector.items())


def _forms(first: str, namespace: str) -> tuple[str, ...]:
    return (f"{first}.{namespace}.svc.{DOMAIN}", f"{first}.{namespace}.svc", f"{first}.{namespace}")


def entries(services: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[Entry]:
    """Every Service and subdomain pod name of the cluster, with their addresses."""
    candidates = [p for p in pods if (p.get("status") or {}).get("podIP")]
    out: list[Entry] = []
    for svc in services:
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        cluster_ip = (svc.get("spec") or {}).get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            out.append(Entry(cluster_ip, _forms(name, ns), ns, name))
            continue
        for pod in candidates:
            if not published(svc, pod):
                continue
            if selects(svc, pod):
                out.append(Entry(pod["status"]["podIP"], _forms(name, ns), ns, name))
            spec = pod.get("spec") or {}
            if spec.get("subdomain") == name and spec.get("hostname") and pod["metadata"]["namespace"] == ns:
                host = f"{spec['hostname']}.{name}"
                out.append(Entry(pod["status"]["podIP"], _forms(host, ns), ns, host))
    return out


def renamed(table: Iterable[Entry], namespaces: Mapping[str, str]) -> list[Entry]:
    """The names as a cluster that holds some namespaces under other names sees them (a Liqo donor: the
    offloaded namespace's Services are reflected into its twin there): entries of the namespaces in
    ``namespaces`` under their new names, no others."""
    out = []
    for entry in table:
        twin = namespaces.get(entry.namespace)
        if twin is not None:
            out.append(Entry(entry.ip, _forms(entry.short, twin), twin, entry.short))
    return out


def hostname(pod: Mapping[str, Any]) -> str:
    """The pod's hostname: ``spec.hostname`` or its name, at most 63 characters, as a kubelet sets it."""
    return str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def hosts_file(pod: Mapping[str, Any], pod_ip: str, names: Iterable[Entry], namespace: str | None = None) -> str:
    """The /etc/hosts of ``pod``, which runs in ``namespace`` (its own unless a donor renamed it)."""
    ns, host = namespace or pod["metadata"]["namespace"], hostname(pod)
    subdomain = (pod.get("spec") or {}).get("subdomain")
    own = f"{host}.{subdomain}.{ns}.svc.{DOMAIN}\t{host}" if subdomain else host
    lines = [HEADER, f"{pod_ip}\t{own}\n"]
    for entry in names:
        if entry.ip != pod_ip or entry.short != f"{host}.{subdomain}":
            shown = (entry.short, *entry.names) if entry.namespace == ns else entry.names
            lines.append(f"{entry.ip}\t{' '.join(shown)}\n")
    return "".join(lines)


def resolv_conf(namespace: str) -> str:
    """The /etc/resolv.conf of a pod in ``namespace``."""
    return (f"search {namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}\n"
            "nameserver 127.0.0.1\noptions ndots:5 attempts:1 timeout:1\n")
