"""Pod Security admission: a namespace's ``pod-security.kubernetes.io/enforce`` level, enforced on pod creation.

As kube-apiserver's built-in PodSecurity plugin does (k8s.io/pod-security-admission), a pod that fails the
level is refused with 403 Forbidden and the message ``pods "<name>" is forbidden: violates PodSecurity
"<level>:<version>": <reason> (<detail>), ...``. Checks run as the real evaluator orders them: the
baseline checks by id, then the restricted ones by id (a restricted check replaces its baseline namesake),
and the reasons and details are worded as it words them. The version is the namespace's
``enforce-version`` label (default ``latest``); every version is judged by the latest rules.

Left out, because nothing the project or its tests creates uses them: the AppArmor, procMount, SELinux,
sysctls and Windows hostProcess checks, the ``audit`` and ``warn`` modes, exemptions, checks on pod
updates (the real plugin re-checks only changes to the fields above), and the warnings a workload whose pod
template would fail gets (Jobs are admitted; their pods are refused when the job controller creates them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .admission import AdmissionRequest
from .errors import ApiError

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
# Capabilities the baseline level lets a container add (the container runtime's defaults).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"})
SECCOMP_ALLOWED = ("RuntimeDefault", "Localhost")
Spec = Mapping[str, Any]


@dataclass(frozen=True)
class Violation:
    """One failed check: the reason (``privileged``) and its detail (which container must do what)."""

    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


def _plural(one: str, many: str, count: int) -> str:
    return one if count == 1 else many


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _containers(spec: Spec) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or ()


def _security(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def _named(spec: Spec, bad: Callable[[Mapping[str, Any]], bool]) -> list[str]:
    return [str(c.get("name")) for c in _containers(spec) if bad(c)]


def _containers_must(names: list[str], what: str) -> str:
    return f"{_plural('container', 'containers', len(names))} {_quote(names)} {what}"


def _pod_or(names: list[str], what: str) -> str:
    """For fields a pod may set for all its containers: ``pod or container "x" must ...``."""
    return f"pod or {_containers_must(names, what)}"


# --- baseline -----------------------------------------------------------------------------------------


def _capabilities_baseline(spec: Spec) -> Violation | None:
    added: set[str] = set()
    names = []
    for c in _containers(spec):
        extra = {str(a) for a in (_security(c).get("capabilities") or {}).get("add") or ()} - BASELINE_CAPABILITIES
        if extra:
            added |= extra
            names.append(str(c.get("name")))
    if not names:
        return None
    return Violation("non-default capabilities", _containers_must(
        names, f"must not include {_quote(sorted(added))} in securityContext.capabilities.add"))


def _host_namespaces(spec: Spec) -> Violation | None:
    shared = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return Violation("host namespaces", ", ".join(shared)) if shared else None


def _host_path_volumes(spec: Spec) -> Violation | None:
    names = [str(v.get("name")) for v in spec.get("volumes") or () if "hostPath" in v]
    if not names:
        return None
    return Violation("hostPath volumes", f"{_plural('volume', 'volumes', len(names))} {_quote(names)}")


def _host_ports(spec: Spec) -> Violation | None:
    names, ports = [], set()
    for c in _containers(spec):
        used = {int(p["hostPort"]) for p in c.get("ports") or () if p.get("hostPort")}
        if used:
            names.append(str(c.get("name")))
            ports |= used
    if not names:
        return None
    listed = ", ".join(sorted(str(p) for p in ports))  # the real plugin sorts them as strings
    return Violation("hostPort", f"{_plural('container', 'containers', len(names))} {_quote(names)} "
                                 f"{_plural('uses', 'use', len(names))} "
                                 f"{_plural('hostPort', 'hostPorts', len(ports))} {listed}")


def _privileged(spec: Spec) -> Violation | None:
    names = _named(spec, lambda c: _security(c).get("privileged") is True)
    if not names:
        return None
    return Violation("privileged", _containers_must(names, "must not set securityContext.privileged=true"))


def _seccomp_type(holder: Mapping[str, Any]) -> str | None:
    profile = holder.get("seccompProfile") or {}
    return str(profile["type"]) if profile.get("type") else None


def _seccomp_baseline(spec: Spec) -> Violation | None:
    return _seccomp(spec, restricted=False)


# --- restricted ---------------------------------------------------------------------------------------


def _allow_privilege_escalation(spec: Spec) -> Violation | None:
    names = _named(spec, lambda c: _security(c).get("allowPrivilegeEscalation") is not False)
    if not names:
        return None
    return Violation("allowPrivilegeEscalation != false",
                     _containers_must(names, "must set securityContext.allowPrivilegeEscalation=false"))


def _capabilities_restricted(spec: Spec) -> Violation | None:
    missing_drop, adding, forbidden = [], [], set()
    for c in _containers(spec):
        caps = _security(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            missing_drop.append(str(c.get("name")))
        extra = {str(a) for a in caps.get("add") or ()} - {"NET_BIND_SERVICE"}
        if extra:
            adding.append(str(c.get("name")))
            forbidden |= extra
    details = []
    if missing_drop:
        details.append(_containers_must(missing_drop, 'must set securityContext.capabilities.drop=["ALL"]'))
    if adding:
        details.append(_containers_must(
            adding, f"must not include {_quote(sorted(forbidden))} in securityContext.capabilities.add"))
    return Violation("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Spec) -> Violation | None:
    names, kinds = [], set()
    for volume in spec.get("volumes") or ():
        types = {k for k in volume if k != "name"} - RESTRICTED_VOLUMES
        if types:
            names.append(str(volume.get("name")))
            kinds |= types
    if not names:
        return None
    return Violation("restricted volume types", f"{_plural('volume', 'volumes', len(names))} {_quote(names)} "
                                                f"{_plural('uses', 'use', len(names))} restricted "
                                                f"{_plural('volume type', 'volume types', len(kinds))} "
                                                f"{_quote(sorted(kinds))}")


def _setters(pod_bad: bool, names: list[str]) -> str:
    parts = ["pod"] if pod_bad else []
    if names:
        parts.append(f"{_plural('container', 'containers', len(names))} {_quote(names)}")
    return " and ".join(parts)


def _run_as_non_root(spec: Spec) -> Violation | None:
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    explicit = _named(spec, lambda c: _security(c).get("runAsNonRoot") is False)
    if pod_value is False or explicit:
        return Violation("runAsNonRoot != true",
                         f"{_setters(pod_value is False, explicit)} must not set securityContext.runAsNonRoot=false")
    implicit = [] if pod_value is True else _named(spec, lambda c: _security(c).get("runAsNonRoot") is not True)
    if not implicit:
        return None
    return Violation("runAsNonRoot != true", _pod_or(implicit, "must set securityContext.runAsNonRoot=true"))


def _run_as_user(spec: Spec) -> Violation | None:
    pod_root = (spec.get("securityContext") or {}).get("runAsUser") == 0
    names = _named(spec, lambda c: _security(c).get("runAsUser") == 0)
    if not pod_root and not names:
        return None
    return Violation("runAsUser=0", f"{_setters(pod_root, names)} must not set runAsUser=0")


def _seccomp(spec: Spec, restricted: bool) -> Violation | None:
    pod_type = _seccomp_type(spec.get("securityContext") or {})
    allowed = SECCOMP_ALLOWED if restricted else (*SECCOMP_ALLOWED, "")

    def bad(value: str | None) -> bool:
        return value is not None and value not in allowed

    explicit = _named(spec, lambda c: bad(_seccomp_type(_security(c))))
    if bad(pod_type) or explicit:
        types = [pod_type, *(_seccomp_type(_security(c)) for c in _containers(spec))]
        values = sorted({v for v in types if v is not None and bad(v)})
        return Violation("seccompProfile", f"{_setters(bad(pod_type), explicit)} must not set "
                                           f"securityContext.seccompProfile.type to {_quote(values)}")
    if not restricted or pod_type is not None:
        return None
    implicit = _named(spec, lambda c: _seccomp_type(_security(c)) is None)
    if not implicit:
        return None
    return Violation("seccompProfile", _pod_or(
        implicit, 'must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"'))


def _seccomp_restricted(spec: Spec) -> Violation | None:
    return _seccomp(spec, restricted=True)


Check = Callable[[Spec], "Violation | None"]
BASELINE: tuple[tuple[str, Check], ...] = (
    ("capabilities_baseline", _capabilities_baseline),
    ("hostNamespaces", _host_namespaces),
    ("hostPathVolumes", _host_path_volumes),
    ("hostPorts", _host_ports),
    ("privileged", _privileged),
    ("seccompProfile_baseline", _seccomp_baseline),
)
RESTRICTED: tuple[tuple[str, Check], ...] = (
    ("allowPrivilegeEscalation", _allow_privilege_escalation),
    ("capabilities_restricted", _capabilities_restricted),
    ("restrictedVolumes", _restricted_volumes),
    ("runAsNonRoot", _run_as_non_root),
    ("runAsUser", _run_as_user),
    ("seccompProfile_restricted", _seccomp_restricted),
)
_REPLACED_BY_RESTRICTED = {"seccompProfile_baseline"}


def violations(spec: Spec, level: str) -> list[Violation]:
    """What ``spec`` (a pod's spec) breaks at ``level``, in the real evaluator's order."""
    if level == "privileged":
        return []
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}; one of {', '.join(LEVELS)}")
    checks = [c for c in BASELINE if level == "baseline" or c[0] not in _REPLACED_BY_RESTRICTED]
    if level == "restricted":
        checks += RESTRICTED
    return [v for _, check in checks if (v := check(spec)) is not None]


def namespace_policy(labels: Mapping[str, str]) -> tuple[str, str]:
    """(level, version) a namespace enforces; an unknown level is treated as the strictest, as the real
    plugin treats a label it cannot parse."""
    level = labels.get(ENFORCE_LABEL) or "privileged"
    return (level if level in LEVELS else "restricted"), (labels.get(VERSION_LABEL) or "latest")


def pod_security_hook(api: Any) -> Callable[[AdmissionRequest], None]:
    """The validating hook on pod creation, reading the pod's namespace from ``api``."""

    def check(req: AdmissionRequest) -> None:
        namespace = api.find(api.registry.by_kind("v1", "Namespace"), "", req.namespace) or {}
        level, version = namespace_policy((namespace.get("metadata") or {}).get("labels") or {})
        found = violations(req.object.get("spec") or {}, level)
        if found:
            raise ApiError(403, "Forbidden", f'pods "{req.name}" is forbidden: violates PodSecurity '
                                             f'"{level}:{version}": {", ".join(map(str, found))}',
                           req.name, "", "pods")

    return check


def install(api: Any) -> None:
    """Enforce each namespace's Pod Security level on pod creation (before quota, as kube-apiserver orders)."""
    api.admission.add_validating("pods", pod_security_hook(api), ("CREATE",))
