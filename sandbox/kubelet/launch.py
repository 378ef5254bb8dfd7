"""Turns a container of a pod spec into a local process launch: argv, environment and working directory.

See ``podfiles.py`` for the path mapping and what the environment holds. The image has no ENTRYPOINT and
``python3`` as CMD, like the official Python images: ``args`` without ``command`` run as the command, and
neither runs ``python3``. A ``command[0]`` without a slash is looked up on the container's PATH (the
image's interpreter first, then the host's /usr/local/bin, /usr/bin, /bin); an absolute path to a
``python*`` binary runs the image's interpreter, since a stock image's /usr/local/bin/python3 is it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .images import Runtime
from .podfiles import BASE_PATH, PathMap, expand

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


class StartError(Exception):
    """The process cannot be started (the kubelet reports StartError, exit code 128)."""


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one container's process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    paths: PathMap


def _argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = command + args if command else (args or ["python3"])
    return [expand(str(a), env) for a in argv]


def _resolve(argv0: str, runtime: Runtime, path: str) -> str:
    if "/" in argv0:
        if _PYTHON.match(Path(argv0).name) and not Path(argv0).is_relative_to(runtime.bin_dir):
            return str(runtime.bin_dir / "python3")
        return argv0
    found = shutil.which(argv0, path=path)
    if found is None:
        raise StartError(f'exec: "{argv0}": executable file not found in $PATH: the image provides python, '
                         "python3 and the host's /usr/bin tools")
    return found


def build_launch(pod: Mapping[str, Any], container: Mapping[str, Any], runtime: Runtime,
                 spec_env: Mapping[str, str], paths: PathMap) -> Launch:
    """The launch of ``container`` given its resolved image, the env its spec gives and its path map."""
    # a pod's hostname is spec.hostname when set (an Indexed Job's pods, StatefulSets), else its name
    name = (pod.get("spec") or {}).get("hostname") or (pod.get("metadata") or {}).get("name", "")
    home = paths.rootfs / "root"
    home.mkdir(parents=True, exist_ok=True)
    # LANG as the official Python images set it (without it, Python adds LC_CTYPE to the environment)
    env = {"PATH": f"{runtime.bin_dir}:{BASE_PATH}", "HOSTNAME": name, "HOME": str(home), "LANG": "C.UTF-8"}
    env.update({k: paths.rewrite(v) for k, v in spec_env.items()})
    argv = [paths.rewrite(a) for a in _argv(container, env)]
    argv[0] = _resolve(argv[0], runtime, env["PATH"])
    working = container.get("workingDir")
    if working:
        rewritten = paths.rewrite(working)
        cwd = Path(rewritten) if rewritten != working else paths.host(working)
    else:
        cwd = paths.rootfs
    cwd.mkdir(parents=True, exist_ok=True)
    return Launch(tuple(argv), env, cwd, paths)
