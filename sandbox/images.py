"""Container images as local interpreters: which Python a pod's ``image`` runs with.

Each image resolves to a *runtime*: a ``bin`` folder the kubelet puts first on the container's PATH, with
``python``, ``python3`` and ``python3.X`` in it. Two runtimes are built in:

- ``project``: the interpreter running the sandbox (it has ``gpu_offload`` and everything installed with it);
- ``stock``: a Python with numpy and *without* gpu_offload, like a public Python/PyTorch image. It is a
  venv without pip made once per sandbox run from the base interpreter (``sys._base_executable``; a venv
  never sees the packages of the venv it was made from), with the stock packages (``numpy``) linked in
  from where the sandbox's interpreter has them. No network, about a tenth of a second.

The default map (first match wins; ``fnmatch`` patterns on the full image reference):

=================================================================  =========
``*gpu-offload*``, ``jupyterhub/*``, ``*jupyter/*`` (notebook images)  project
``python:*``, ``*/python:*``, ``*pytorch*``, ``*numpy*``              stock
=================================================================  =========

Any other image is not "pulled": the pod's container waits in ``ErrImagePull`` then ``ImagePullBackOff``.
A map entry may also name an interpreter path instead of ``project`` or ``stock``.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT = "project"
STOCK = "stock"
DEFAULT_MAP: tuple[tuple[str, str], ...] = (
    # notebook images: a user's server needs jupyterhub-singleuser, and in production has gpu_offload too
    ("*gpu-offload*", PROJECT), ("jupyterhub/*", PROJECT), ("*jupyter/*", PROJECT),
    ("python:*", STOCK), ("*/python:*", STOCK), ("*pytorch*", STOCK), ("*numpy*", STOCK),
)
STOCK_PACKAGES = ("numpy",)


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
                 stock_packages: Sequence[str] = STOCK_PACKAGES) -> None:
        self.root = state_dir / "images"
        self.mapping = tuple(mapping)
        self.stock_packages = tuple(stock_packages)
        self._lock = threading.Lock()
        self._built: dict[str, Runtime] = {}
        self.missing: set[str] = set()
        """Images made unpullable on purpose (a fault), whatever the map says."""

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
                self._built[target] = self._build(target)
            built = self._built[target]
        return Runtime(image, built.bin_dir, built.python)

    def _build(self, target: str) -> Runtime:
        if target == PROJECT:
            bin_dir = self.root / PROJECT / "bin"
            _shim(bin_dir, Path(sys.executable))
            return Runtime(target, bin_dir, Path(sys.executable))
        if target == STOCK:
            return self._build_stock()
        interpreter = Path(target)
        if not os.access(interpreter, os.X_OK):
            raise ImageError(f"image map entry {target!r} is not an executable interpreter: fix the map")
        bin_dir = self.root / interpreter.name / "bin"
        _shim(bin_dir, interpreter)
        return Runtime(target, bin_dir, interpreter)

    def _build_stock(self) -> Runtime:
        venv = self.root / STOCK / "venv"
        base = getattr(sys, "_base_executable", sys.executable)
        if not (venv / "bin" / "python").exists():
            subprocess.run([base, "-m", "venv", "--without-pip", "--symlinks", str(venv)], check=True,
                           capture_output=True, timeout=120, env={"PATH": os.environ.get("PATH", "")})
        site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        for package in self.stock_packages:
            self._link_package(package, site)
        return Runtime(STOCK, venv / "bin", venv / "bin" / "python")

    @staticmethod
    def _link_package(package: str, site: Path) -> None:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImageError(f"stock image: package {package!r} is not installed where the sandbox runs; "
                             "install it (pip install numpy) or drop it from the stock packages")
        source = Path(next(iter(spec.submodule_search_locations)))
        # the package, its vendored libraries (numpy.libs) and its metadata, so importlib.metadata works
        for item in source.parent.iterdir():
            if item.name == package or item.name.startswith((f"{package}.libs", f"{package}-")):
                link = site / item.name
                if not link.exists():
                    link.symlink_to(item, target_is_directory=item.is_dir())
