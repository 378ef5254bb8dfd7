"""A container's environment and files, as the test kubelet gives them to a local process.

Path mapping (there is no container filesystem): each pod has a folder
``<state>/pods/<namespace>_<name>_<uid>/`` whose ``rootfs/`` stands for the container's ``/``.

- Volumes are materialized in ``volumes/<volume name>/`` (Secret and ConfigMap keys as files with their
  modes, emptyDir empty) and mounted by a symlink at ``rootfs/<mountPath>`` (``subPath`` honoured). An
  isolated container also has them bound at their real ``mountPath`` (``isolation.Isolation.mounts``), so
  paths a program builds itself reach them too.
- Every absolute path under a ``mountPath`` that appears in ``command``, ``args``, env values or
  ``workingDir`` is rewritten to its place under ``rootfs/``: ``python3 /gpu-offload/runner.pyz`` runs
  ``python3 <pod folder>/rootfs/gpu-offload/runner.pyz``. Paths the program builds itself are not.
- ``workingDir`` (rewritten the same way, created if missing) defaults to ``rootfs/``; ``HOME`` defaults to
  ``rootfs/root``.

Environment: only what the pod spec gives (``envFrom``, then ``env`` with ``$(VAR)`` expansion, valueFrom
Secrets, ConfigMaps, the downward API and resource fields), plus what a container runtime adds: ``PATH``
(the image's interpreter first), ``HOSTNAME`` (the pod's hostname: ``spec.hostname``, else its name), ``HOME`` and ``LANG=C.UTF-8`` (as the
Python images set it). Nothing of the host leaks.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..apiserver.matching import quantity

Lookup = Callable[[str, str], "dict[str, Any] | None"]
"""``lookup(kind, name)`` -> the Secret (``"secrets"``) or ConfigMap (``"configmaps"``) of the pod's
namespace, or None if it does not exist."""

BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


class ConfigError(Exception):
    """The container cannot be configured (CreateContainerConfigError): a missing Secret, ConfigMap or key."""


class MountError(Exception):
    """A volume's source is missing (FailedMount): the kubelet retries until it appears."""


@dataclass(frozen=True)
class PodContext:
    """What the downward API may expose about a pod."""

    namespace: str
    name: str
    uid: str
    node_name: str
    service_account: str
    pod_ip: str
    host_ip: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def _data(obj: Mapping[str, Any], kind: str) -> dict[str, bytes]:
    if kind == "secrets":
        out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
        return out
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


_KIND_WORD = {"secrets": "secret", "configmaps": "configmap"}


def _source(lookup: Lookup, kind: str, name: str, optional: bool, ns: str) -> dict[str, bytes] | None:
    obj = lookup(kind, name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{_KIND_WORD[kind]} "{name}" not found in namespace "{ns}": create it, or mark '
                          "the reference optional")
    return _data(obj, kind)


def field_value(ctx: PodContext, path: str) -> str:
    """The downward API value of ``fieldPath``."""
    simple = {"metadata.name": ctx.name, "metadata.namespace": ctx.namespace, "metadata.uid": ctx.uid,
              "spec.nodeName": ctx.node_name, "spec.serviceAccountName": ctx.service_account,
              "status.podIP": ctx.pod_ip, "status.podIPs": ctx.pod_ip, "status.hostIP": ctx.host_ip,
              "status.hostIPs": ctx.host_ip}
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        source = ctx.labels if match.group(1) == "labels" else ctx.annotations
        return source.get(match.group(2), "")
    raise ConfigError(f"fieldRef {path!r} is not supported by the downward API: use metadata.name, "
                      "metadata.namespace, metadata.uid, metadata.labels['k'], spec.nodeName, "
                      "spec.serviceAccountName, status.podIP or status.hostIP")


def resource_value(pod: Mapping[str, Any], container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """A resourceFieldRef value: the container's request or limit divided by ``divisor``, rounded up."""
    target = container
    if ref.get("containerName"):
        target = next((c for c in (pod.get("spec") or {}).get("containers") or []
                       if c.get("name") == ref["containerName"]), container)
    kind, _, resource = str(ref.get("resource", "")).partition(".")
    amount = ((target.get("resources") or {}).get(kind) or {}).get(resource)
    if amount is None:
        return "0"
    return str(math.ceil(quantity(amount) / quantity(ref.get("divisor") or "1")))


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes, the rest stays."""
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def _env_from(container: Mapping[str, Any], lookup: Lookup, ns: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for key, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            ref = source.get(key)
            if ref:
                data = _source(lookup, kind, ref["name"], bool(ref.get("optional")), ns) or {}
                env.update({source.get("prefix", "") + k: v.decode() for k, v in data.items()})
    return env


def _value_from(var: Mapping[str, Any], pod: Mapping[str, Any], container: Mapping[str, Any],
                ctx: PodContext, lookup: Lookup) -> str | None:
    source = var["valueFrom"]
    if "fieldRef" in source:
        return field_value(ctx, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        return resource_value(pod, container, source["resourceFieldRef"])
    for key, kind in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
        ref = source.get(key)
        if ref:
            optional = bool(ref.get("optional"))
            data = _source(lookup, kind, ref["name"], optional, ctx.namespace)
            if data is None:
                return None
            if ref["key"] not in data:
                if optional:
                    return None
                raise ConfigError(f'couldn\'t find key {ref["key"]} in {_KIND_WORD[kind]} '
                                  f'{ctx.namespace}/{ref["name"]}: add the key or mark the reference optional')
            return data[ref["key"]].decode()
    raise ConfigError(f"env {var.get('name')}: unsupported valueFrom {sorted(source)}")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], ctx: PodContext,
                  lookup: Lookup) -> dict[str, str]:
    """The variables the pod spec gives the container: envFrom first, then env (which wins)."""
    env = _env_from(container, lookup, ctx.namespace)
    for var in container.get("env") or []:
        if "valueFrom" in var:
            value = _value_from(var, pod, container, ctx, lookup)
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = expand(str(var.get("value", "")), env)
    return env


def _write_items(target: Path, data: Mapping[str, bytes], items: list[dict[str, Any]] | None,
                 default_mode: int) -> None:
    chosen = [(i["key"], i["path"], i.get("mode", default_mode)) for i in items] if items else [
        (k, k, default_mode) for k in data]
    for key, rel, mode in chosen:
        if key not in data:
            raise MountError(f"key {key} not found in the volume's source")
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[key])
        path.chmod(mode)


def materialize_volumes(pod: Mapping[str, Any], pod_dir: Path, lookup: Lookup) -> dict[str, Path]:
    """Create every volume of ``pod`` under ``pod_dir/volumes``; returns name -> folder.

    Raises MountError (retry later) when a Secret or ConfigMap is missing, ConfigError for a volume type
    the sandbox does not provide.
    """
    out: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume["name"]
        target = pod_dir / "volumes" / name
        target.mkdir(parents=True, exist_ok=True)
        for key, kind, ref_name in (("secret", "secrets", "secretName"), ("configMap", "configmaps", "name")):
            source = volume.get(key)
            if source is None:
                continue
            obj = lookup(kind, source.get(ref_name, ""))
            if obj is None:
                if source.get("optional"):
                    break
                raise MountError(f'MountVolume.SetUp failed for volume "{name}" : {_KIND_WORD[kind]} '
                                 f'"{source.get(ref_name)}" not found')
            _write_items(target, _data(obj, kind), source.get("items"), source.get("defaultMode", 0o644))
            break
        else:
            if "emptyDir" not in volume:
                kinds = sorted(set(volume) - {"name"})
                raise ConfigError(f'volume "{name}" of type {kinds} is not provided by the sandbox kubelet: '
                                  "use secret, configMap or emptyDir volumes")
        out[name] = target
    return out


@dataclass(frozen=True)
class PathMap:
    """Where the container's absolute paths live on the host (see the module docstring)."""

    rootfs: Path
    mount_paths: tuple[str, ...]

    def rewrite(self, text: str) -> str:
        """``text`` with every path under a mountPath moved under ``rootfs``."""
        if not self.mount_paths:
            return text
        # one pass over all mounts (longest first), so a rewritten path is never rewritten again
        names = "|".join(re.escape(m.rstrip("/")) for m in sorted(self.mount_paths, key=len, reverse=True))
        pattern = r"(?<![\w./-])(?:" + names + r")(?=/|$|[^\w.-])"
        return re.sub(pattern, lambda m: str(self.rootfs) + m.group(0), text)

    def host(self, container_path: str) -> Path:
        """The host path of an absolute container path."""
        return self.rootfs / container_path.lstrip("/")


def volume_binds(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> tuple[tuple[str, str], ...]:
    """(host folder or file, mountPath) of each volumeMount of ``container``, parents before children."""
    mounts = container.get("volumeMounts") or []
    pairs = [(str(volumes[m["name"]] / m.get("subPath", "")), m["mountPath"].rstrip("/") or "/")
             for m in mounts if m["name"] in volumes]
    return tuple(sorted(pairs, key=lambda pair: pair[1].count("/")))


def mount_volumes(container: Mapping[str, Any], volumes: Mapping[str, Path], rootfs: Path) -> PathMap:
    """Link each volumeMount of ``container`` into ``rootfs``; returns the container's path map."""
    paths = []
    rootfs.mkdir(parents=True, exist_ok=True)
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            raise ConfigError(f'volumeMount "{mount["name"]}" names no volume of the pod: add the volume')
        source = volumes[mount["name"]] / mount.get("subPath", "")
        link = rootfs / mount["mountPath"].lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source, target_is_directory=source.is_dir())
        paths.append(mount["mountPath"])
    return PathMap(rootfs, tuple(paths))
