"""The project's container images, read from ``images.json``: the runner that follows the kernel.

``images.json`` (beside this module) is the one place where the images' names, tags, bases and declared
versions are written; ``images/build.sh`` builds from it and writes the declared versions as image labels.
Here the kernel picks its default runner image (the one for its own Python minor version, with torch when
the kernel has torch) and checks an image before launch: a runner whose Python minor, cloudpickle major or
torch major differs from the kernel's cannot load the cell's variables, so the cell is refused with the fix.
Pure: no I/O besides reading the package's own manifest and the kernel's installed versions.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

MANIFEST = "images.json"


@dataclass(frozen=True)
class Versions:
    """What a Python environment holds, as image labels declare it (empty: not installed)."""

    python: str
    """Major.minor, e.g. ``3.11``."""
    cloudpickle: str = ""
    torch: str = ""


@dataclass(frozen=True)
class ImageSpec:
    """One image of the manifest."""

    role: str
    """``hub``, ``singleuser``, ``runner`` (slim) or ``runner-cuda`` (with torch)."""
    image: str
    """Name and tag, without a registry: ``jupyter-gpu-offload/runner:0.1.0-py3.11``."""
    recipe: str
    """Folder of ``images/`` holding its Dockerfile."""
    base: str
    """The published base image (the recipe's default ``BASE``)."""
    debian: str
    """Debian suite of the local debootstrap base tests build it on; empty: not built here."""
    declared: Versions
    jupyterhub: str = ""
    """For the hub: the JupyterHub of its z2jh base image, which the recipe keeps (and installs on a local
    base); empty for the other roles."""

    @property
    def repository(self) -> str:
        return self.image.rsplit(":", 1)[0]


@dataclass(frozen=True)
class Manifest:
    labels: dict[str, str]
    """Label key of each declared version (``python``, ``cloudpickle``, ``torch``)."""
    images: tuple[ImageSpec, ...]

    def role(self, role: str) -> tuple[ImageSpec, ...]:
        return tuple(spec for spec in self.images if spec.role == role)


def parse_manifest(raw: dict[str, Any]) -> Manifest:
    specs = tuple(
        ImageSpec(role=entry["role"], image=entry["image"], recipe=entry["recipe"], base=entry["base"],
                  debian=entry["debian"],
                  declared=Versions(entry["python"], entry["cloudpickle"], entry["torch"]),
                  jupyterhub=entry.get("jupyterhub", ""))
        for entry in raw["images"]
    )
    return Manifest(dict(raw["labels"]), specs)


@lru_cache(maxsize=1)
def manifest() -> Manifest:
    """The manifest shipped with the package."""
    return parse_manifest(json.loads(resources.files(__package__).joinpath(MANIFEST).read_text()))


def _installed(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def kernel_versions() -> Versions:
    """This interpreter's versions (torch is looked up, not imported: importing it takes seconds)."""
    return Versions(f"{sys.version_info[0]}.{sys.version_info[1]}", _installed("cloudpickle"), _installed("torch"))


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def default_runner(kernel: Versions, registry: str = "", table: Manifest | None = None) -> str:
    """The runner image for ``kernel``: its Python minor, with torch (the CUDA variant) when it has torch.

    ``registry`` (e.g. ``registry.example.org/ml``) is where the images were pushed; empty: the bare name.
    Raises ValueError naming the fix when the manifest has no runner for that Python.
    """
    table = table or manifest()
    role = "runner-cuda" if kernel.torch else "runner"
    for spec in table.role(role):
        if spec.declared.python == kernel.python:
            return f"{registry.rstrip('/')}/{spec.image}" if registry else spec.image
    built = ", ".join(sorted({s.declared.python for s in table.role(role)}))
    raise ValueError(
        f"there is no {role} image for Python {kernel.python} (this kernel's); runner images exist for Python "
        f"{built}. Run the notebook on one of those, or give an image with Python {kernel.python} "
        "(--image, or GPU_OFFLOAD_IMAGE).")


def declared(image: str, table: Manifest | None = None) -> ImageSpec | None:
    """The manifest's entry for ``image`` (with or without a registry in front), None for any other image."""
    table = table or manifest()
    for spec in table.images:
        if image == spec.image or image.endswith("/" + spec.image):
            return spec
    return None


def mismatches(kernel: Versions, runner: Versions) -> list[str]:
    """What keeps the kernel's variables from loading in the runner, one phrase each."""
    found = []
    if runner.python != kernel.python:
        found.append(f"Python {runner.python} (the kernel has {kernel.python})")
    if runner.cloudpickle and kernel.cloudpickle and _major(runner.cloudpickle) != _major(kernel.cloudpickle):
        found.append(f"cloudpickle {runner.cloudpickle} (the kernel has {kernel.cloudpickle})")
    if runner.torch and kernel.torch and _major(runner.torch) != _major(kernel.torch):
        found.append(f"torch {runner.torch} (the kernel has {kernel.torch})")
    return found


def check_runner(image: str, kernel: Versions, registry: str = "", table: Manifest | None = None) -> str | None:
    """None when ``image`` may run this kernel's cells, else the sentence saying why not and what to use.

    Only images of the manifest declare their versions; any other image is checked by the runner itself
    when it starts (its hello names its Python).
    """
    spec = declared(image, table)
    if spec is None:
        return None
    found = mismatches(kernel, spec.declared)
    if not found:
        return None
    try:
        fix = f"use {default_runner(kernel, registry, table)} (the default when --image is not given)"
    except ValueError as exc:
        fix = str(exc)
    return (f"Nothing was launched: runner image {image} declares {' and '.join(found)}, so the cell's "
            f"variables could not travel between them; {fix}, or run the kernel on Python "
            f"{spec.declared.python}.")
