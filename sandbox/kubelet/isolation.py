"""Who a container runs as and what it is shut in: pure decisions, plus the shim command line.

As root, every container runs through ``nsinit.py`` (its own PID and mount namespace, the pod's network
namespace, its user). Its user is, as a container runtime decides it: ``runAsUser``/``runAsGroup`` of the
container's ``securityContext``, else the pod's, else the image's default user (uid 1000, gid 100 for the
notebook images, as ``jovyan`` in the Jupyter images; root for the others). Without ``runAsGroup`` the group
is the image user's (100 for 1000 in a notebook image) or 0, as a runtime does for a uid the image's
/etc/passwd does not know. ``supplementalGroups`` and ``fsGroup`` are added to the groups.

As another user, the sandbox cannot switch users or make namespaces: containers run as that user, sharing
the host's process table and network, and the kubelet says so once.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NSINIT = Path(__file__).with_name("nsinit.py")
NOTEBOOK_IMAGES = ("*jupyter/*", "jupyterhub/singleuser*", "*/jupyterhub/singleuser*", "*k8s-singleuser*")
"""Images whose default user is jovyan (1000:100), as the Jupyter images and their derivatives."""
NOTEBOOK_USER = (1000, 100)


@dataclass(frozen=True)
class User:
    """The identity a container's command runs with."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    explicit: bool = True
    """Set by the pod spec (False: the image's default)."""


@dataclass(frozen=True)
class Isolation:
    """How to shut one container in (only where the sandbox runs as root)."""

    user: User
    netns: str | None = None
    """``/run/netns/<name>`` of the pod, or None to share the host's network."""
    binds: tuple[tuple[str, str], ...] = ()
    """Files bind-mounted over the host's in the container's mount namespace (its /etc/hosts...)."""
    hostname: str = "localhost"
    """The container's ``uname -n``: the pod's hostname."""
    reveal: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Closed folders hidden under a tmpfs, and the entries of each bind-mounted back (:func:`reveal_plan`)."""
    mounts: tuple[tuple[str, str], ...] = ()
    """(host folder or file, mountPath): the container's volumes, bound at their paths (nsinit.py)."""


def can_isolate() -> bool:
    """True where the sandbox can switch users and make namespaces (root on Linux)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


def _security(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("securityContext") or {}


def container_user(pod: Mapping[str, Any], container: Mapping[str, Any], image: str) -> User:
    """The user ``container`` of ``pod`` runs as, per its security contexts and its image."""
    pod_sc, own_sc = _security(pod.get("spec")), _security(container)
    uid = own_sc.get("runAsUser", pod_sc.get("runAsUser"))
    gid = own_sc.get("runAsGroup", pod_sc.get("runAsGroup"))
    default = NOTEBOOK_USER if any(fnmatch.fnmatchcase(image, p) for p in NOTEBOOK_IMAGES) else (0, 0)
    explicit = uid is not None or gid is not None
    if uid is None:
        uid = default[0]
    if gid is None:
        gid = default[1] if uid == default[0] else 0
    extra = [*(pod_sc.get("supplementalGroups") or [])]
    if pod_sc.get("fsGroup") is not None:
        extra.append(pod_sc["fsGroup"])
    groups = tuple(dict.fromkeys(int(g) for g in [gid, *extra]))
    return User(int(uid), int(gid), groups, explicit)


def _can(mode: os.stat_result, user: User, bits: tuple[int, int, int]) -> bool:
    if user.uid == 0:
        return True
    if mode.st_uid == user.uid:
        return bool(mode.st_mode & bits[0])
    if mode.st_gid in user.groups:
        return bool(mode.st_mode & bits[1])
    return bool(mode.st_mode & bits[2])


def _closed_folders(path: Path, user: User) -> list[Path]:
    # folders on the way to ``path`` (and to what its symlinks point at) that ``user`` may not enter
    closed: list[Path] = []
    for target in dict.fromkeys([Path(os.path.abspath(path)), Path(os.path.realpath(path))]):
        for folder in reversed(target.parents):
            try:
                info = os.stat(folder)
            except FileNotFoundError:
                break  # the exec fails and says so (StartError)
            if not _can(info, user, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)) and folder not in closed:
                closed.append(folder)
    return closed


def reveal_plan(paths: Sequence[tuple[Path, bool]], user: User) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """How to let ``user`` reach ``paths`` (``(path, executed)``) in the container's mount namespace.

    A folder ``user`` may not enter (the sandbox's Python under /root, pytest's private /tmp folder) is
    covered by an empty tmpfs in which only the entries on the way to ``paths`` are bind-mounted back: the
    container reaches what it runs and nothing else of that folder. Raises PermissionError naming a file
    that is there but that ``user`` may not read or run, which no bind mount changes.
    """
    plan: dict[Path, list[str]] = {}
    for path, executed in paths:
        for folder in _closed_folders(path, user):
            for target in dict.fromkeys([Path(os.path.abspath(path)), Path(os.path.realpath(path))]):
                if target.is_relative_to(folder) and target != folder:
                    child = folder / target.relative_to(folder).parts[0]
                    plan.setdefault(folder, [])
                    if str(child) not in plan[folder]:
                        plan[folder].append(str(child))
        try:
            info = os.stat(path)
        except FileNotFoundError:
            continue
        bits = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH) if executed or stat.S_ISDIR(info.st_mode) else \
            (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
        if not _can(info, user, bits):
            raise PermissionError(f"uid {user.uid} may not {'run' if executed else 'read'} {path} (mode "
                                  f"{info.st_mode & 0o777:o}, owner {info.st_uid})")
    return tuple((str(folder), tuple(children)) for folder, children in
                 sorted(plan.items(), key=lambda item: len(item[0].parts)))


def hand_over(folder: Path, user: User) -> None:
    """Give ``folder`` and everything in it to ``user``, as a runtime gives an image's home to its user."""
    if user.uid == 0 or not folder.exists():
        return
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), user.uid, user.gid)
    os.chown(folder, user.uid, user.gid)


def shim_argv(argv: Sequence[str], cwd: Path, isolation: Isolation, status_fd: int, join: int | None = None
              ) -> list[str]:
    """The command line that runs ``argv`` through the shim (``join``: the pid of a container's PID 1)."""
    user = isolation.user
    spec = {"argv": list(argv), "cwd": str(cwd), "uid": user.uid if user.uid != 0 else None, "gid": user.gid,
            "status_fd": status_fd, "hostname": isolation.hostname,
            "groups": list(user.groups), "netns": isolation.netns, "binds": [list(b) for b in isolation.binds],
            "reveal": [[folder, list(children)] for folder, children in isolation.reveal],
            "mounts": [list(m) for m in isolation.mounts],
            "join": join}
    return [sys.executable, "-I", "-S", str(NSINIT), json.dumps(spec)]
