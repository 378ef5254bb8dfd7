"""Container images as local interpreters: which Python a pod's ``image`` runs with.

Each image resolves to a *runtime*: a ``bin`` folder the kubelet puts first on the container's PATH, with
``python``, ``python3`` and ``python3.X`` in it. Three runtimes are built in:

- ``project``: the interpreter running the sandbox (it has ``gpu_offload`` and everything installed with it),
  with the console scripts a notebook or hub image carries: ``jupyterhub`` and ``jupyterhub-singleuser``
  from the interpreter's own ``bin``, and ``configurable-http-proxy`` (with the ``node`` it runs on) when
  the sandbox's PATH or one of its tool folders has it;
- ``stock``: a Python with numpy and *without* gpu_offload, like a public Python image. It is a venv without
  pip made once per sandbox run from the base interpreter (``sys._base_executable``; a venv never sees the
  packages of the venv it was made from), with the stock packages (``numpy``) and what they require linked
  in from where the sandbox's interpreter has them. No network, about a tenth of a second;
- ``torch``: the same, with torch (whatever build the sandbox's interpreter has, CPU here) besides numpy,
  for PyTorch images. Without torch where the sandbox runs, such an image fails to pull, naming the fix.

The default map (first match wins; ``fnmatch`` patterns on the full image reference, where ``*`` also
matches ``/``, so a registry prefix such as ``quay.io/`` or ``docker.io/library/`` is covered):

==========================================================================  =========
``*gpu-offload*``, ``jupyterhub/*``, ``*/jupyterhub/*``, ``*jupyter/*``      project
``*pytorch*``                                                              torch
``python:*``, ``*/python:*``, ``*numpy*``                                  stock
==========================================================================  =========

Any other image is not "pulled": the pod's container waits in ``ErrImagePull`` then ``ImagePullBackOff``.
A map entry may also name an interpreter path instead of ``project`` or ``stock``.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT = "project"
STOCK = "stock"
TORCH = "torch"
DEFAULT_MAP: tuple[tuple[str, str], ...] = (
    # notebook and hub images: they need jupyterhub-singleuser / jupyterhub, and in production gpu_offload too
    ("*gpu-offload*", PROJECT), ("jupyterhub/*", PROJECT), ("*/jupyterhub/*", PROJECT), ("*jupyter/*", PROJECT),
    ("*pytorch*", TORCH), ("python:*", STOCK), ("*/python:*", STOCK), ("*numpy*", STOCK),
)
STOCK_PACKAGES = ("numpy",)
VENV_PACKAGES = {STOCK: STOCK_PACKAGES, TORCH: ("torch", "numpy")}  # PyTorch images carry numpy too
PROJECT_SCRIPTS = ("jupyterhub", "jupyterhub-singleuser")
HOST_TOOLS = ("configurable-http-proxy",)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class ImageError(RuntimeError):
    """An image the sandbox cannot provide (the kubelet reports it as ErrImagePull)."""


@dataclass(frozen=True)
class Runtime:
    """What an image runs with here."""

    image: str
    bin_dir: Path
    """Put first on the container's PATH; holds python, python3 and python3.X."""
    python: Path


def _shim(bin_dir: Path, interpreter: Path) -> None:
    # A script, not a symlink: a symlinked venv python would no longer find its pyvenv.cfg.
    bin_dir.mkdir(parents=True, exist_ok=True)
    major_minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for name in ("python", "python3", major_minor):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{interpreter}" "$@"\n')
        path.chmod(0o755)


class Images:
    """Resolves image references to runtimes, building them lazily under ``state_dir/images``."""

    def __init__(self, state_dir: Path, mapping: Sequence[tuple[str, str]] = DEFAULT_MAP,
                 stock_packages: Sequence[str] = STOCK_PACKAGES, tool_dirs: Sequence[Path] = ()) -> None:
        self.root = state_dir / "images"
        self.mapping = tuple(mapping)
        self.packages = dict(VENV_PACKAGES, **{STOCK: tuple(stock_packages)})
        self.tool_dirs = tuple(tool_dirs)
        """Searched after the sandbox's PATH for the host tools (configurable-http-proxy)."""
        self._lock = threading.Lock()
        self._built: dict[str, Runtime] = {}
        self.missing: set[str] = set()
        """Images made unpullable on purpose (a fault), whatever the map says."""
        self.pull_times: dict[str, tuple[float, int]] = {}
        """Images that take a pull on each node before their first container there (a fault): seconds and bytes."""
        self._present: set[tuple[str, str]] = set()
        """(node, image) pulled already: the image is on that node."""

    def slow_pull(self, image: str, seconds: float, size: int) -> None:
        """From now on ``image`` is pulled on each node before its first container there, taking ``seconds``
        (a new push of the image: no node has it)."""
        with self._lock:
            self.pull_times[image] = (seconds, size)
            self._present = {(node, known) for node, known in self._present if known != image}

    def pull_needed(self, node: str, image: str) -> tuple[float, int] | None:
        """The pull ``image`` needs on ``node`` (seconds, bytes), or None when it is there or pulls at once."""
        with self._lock:
            if image not in self.pull_times or (node, image) in self._present:
                return None
            return self.pull_times[image]

    def pulled(self, node: str, image: str) -> None:
        with self._lock:
            self._present.add((node, image))

    def target(self, image: str) -> str | None:
        """The map's answer for ``image`` (``project``, ``stock`` or an interpreter path), or None."""
        if image in self.missing:
            return None
        return next((t for pattern, t in self.mapping if fnmatch.fnmatchcase(image, pattern)), None)

    def resolve(self, image: str) -> Runtime:
        """The runtime for ``image``; raises ImageError if the map has no entry. Blocks while building."""
        target = self.target(image)
        if target is None:
            raise ImageError(
                f'Failed to pull image "{image}": the sandbox maps no interpreter to it; use an image the '
                "map knows (e.g. python:3.11-slim, or one containing 'gpu-offload') or add a map entry")
        with self._lock:
            if target not in self._built:
                try:
                    self._built[target] = self._build(target)
                except ImageError as exc:
                    raise ImageError(f'Failed to pull image "{image}": {exc}') from exc
            built = self._built[target]
        return Runtime(image, built.bin_dir, built.python)

    def _build(self, target: str) -> Runtime:
        if target == PROJECT:
            bin_dir = self.root / PROJECT / "bin"
            _shim(bin_dir, Path(sys.executable))
            self._link_tools(bin_dir)
            return Runtime(target, bin_dir, Path(sys.executable))
        if target in self.packages:
            return self._build_venv(target)
        interpreter = Path(target)
        if not os.access(interpreter, os.X_OK):
            raise ImageError(f"image map entry {target!r} is not an executable interpreter: fix the map")
        bin_dir = self.root / interpreter.name / "bin"
        _shim(bin_dir, interpreter)
        return Runtime(target, bin_dir, interpreter)

    def _link_tools(self, bin_dir: Path) -> None:
        # the console scripts of the sandbox's interpreter (their shebang names it), then the host tools
        found = {name: Path(sys.executable).parent / name for name in PROJECT_SCRIPTS}
        search = os.pathsep.join([os.environ.get("PATH", ""), *map(str, self.tool_dirs)])
        for tool in HOST_TOOLS:
            where = shutil.which(tool, path=search)
            node = shutil.which("node", path=search)
            if where and node:  # a node script: the image carries node as well
                found.update({tool: Path(where), "node": Path(node)})
        for name, source in found.items():
            link = bin_dir / name
            if source.exists() and not link.exists():
                link.symlink_to(source.resolve())

    def _build_venv(self, target: str) -> Runtime:
        venv = self.root / target / "venv"
        base = getattr(sys, "_base_executable", sys.executable)
        site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        linked: set[str] = set()
        for package in self.packages[target]:  # before making the venv: a missing package costs nothing
            _link_distribution(package, site, linked, dry_run=True)
        if not (venv / "bin" / "python").exists():
            subprocess.run([base, "-m", "venv", "--without-pip", "--symlinks", str(venv)], check=True,
                           capture_output=True, timeout=120, env={"PATH": os.environ.get("PATH", "")})
        linked.clear()
        for package in self.packages[target]:
            _link_distribution(package, site, linked)
        return Runtime(target, venv / "bin", venv / "bin" / "python")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _link_distribution(name: str, site: Path, linked: set[str], dry_run: bool = False) -> None:
    """Link distribution ``name`` and what it requires into ``site``, from where the sandbox has them.

    A requirement only for an extra is skipped; one with another marker (platform, Python version) is
    linked when installed and skipped otherwise, since its marker then said it was not needed here.
    """
    if _normal(name) in linked:
        return
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ImageError(f"the image needs the Python package {name!r}, which is not installed where the "
                         f"sandbox runs; install it there (pip install {name}) or map the image elsewhere") from None
    linked.add(_normal(name))
    source = Path(str(dist.locate_file("")))
    for top in sorted({f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != ".."}):
        link, item = site / top, source / top
        if not dry_run and item.exists() and not link.exists():
            link.symlink_to(item, target_is_directory=item.is_dir())
    for requirement in dist.requires or ():
        requirement_name, _, marker = requirement.partition(";")
        match = _REQUIREMENT.match(requirement_name)
        if match is None or "extra" in marker:
            continue
        if marker.strip() and not _installed(match.group(1)):
            continue
        _link_distribution(match.group(1), site, linked, dry_run)
