"""The kubeconfig of a sandbox: plain HTTP on 127.0.0.1, one context named after the cluster."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def kubeconfig(url: str, name: str = "sandbox", namespace: str = "default") -> dict[str, object]:
    """A kubeconfig dict for a sandbox at ``url`` (any token is accepted; clients just need one)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": f"{name}-user", "user": {"token": "sandbox-token"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-user", "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, url: str, name: str = "sandbox") -> Path:
    """Write the kubeconfig atomically (readers never see half a file); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig(url, name), sort_keys=False))
    os.replace(tmp, path)
    return path
