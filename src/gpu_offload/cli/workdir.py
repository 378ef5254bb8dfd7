"""The script's directory as a zip for the bundle: what ``.gitignore`` leaves in, under a size cap.

As SkyPilot ships a task's workdir: local imports and small data files travel with the script. Files that
``.gitignore`` files (the directory's own and those below it) exclude stay home, as do ``.git``, caches
and symbolic links leading outside the directory (a link to ``~/.ssh`` must not travel to a donor).
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pathspec

from ..engine.options import WORKDIR_LIMIT_MB as DEFAULT_LIMIT_MB

"""Default cap: a bundle travels in a Secret (1 MiB) or object storage, and whole, on every run."""
_ALWAYS_LEFT_OUT = {".git", "__pycache__", ".ipynb_checkpoints", ".venv", ".mypy_cache", ".pytest_cache"}


class WorkdirError(ValueError):
    """The workdir cannot be shipped; the message names the cause and the fix."""


@dataclass(frozen=True)
class Workdir:
    """The shipped files of one run."""

    archive: bytes
    """A zip of the files, by their path relative to the script's directory."""
    files: tuple[str, ...]
    size: int
    """Bytes of the files before compression (what the cap counts)."""


def _ignored(root: Path, directory: Path, specs: dict[Path, pathspec.PathSpec], path: Path, is_dir: bool) -> bool:
    """Whether a ``.gitignore`` of ``directory`` or of a directory above it (up to ``root``) excludes ``path``."""
    for base in (directory, *directory.parents):
        spec = specs.get(base)
        if spec is not None:
            relative = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            if spec.match_file(relative):
                return True
        if base == root:
            return False
    return False


def _walk(root: Path) -> Iterator[Path]:
    specs: dict[Path, pathspec.PathSpec] = {}
    for current, dirs, names in os.walk(root):
        here = Path(current)
        ignore_file = here / ".gitignore"
        if ignore_file.is_file():
            specs[here] = pathspec.GitIgnoreSpec.from_lines(ignore_file.read_text(errors="replace").splitlines())
        dirs[:] = sorted(d for d in dirs if d not in _ALWAYS_LEFT_OUT and not (here / d).is_symlink()
                         and not _ignored(root, here, specs, here / d, True))
        for name in sorted(names):
            path = here / name
            if not _ignored(root, here, specs, path, False) and _inside(root, path):
                yield path


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve()) and path.is_file()


def pack(script: Path, extra: Sequence[Path] = (), limit_mb: float = DEFAULT_LIMIT_MB) -> Workdir:
    """Zip the script's directory (honouring ``.gitignore``) and the ``--in`` files; raise past ``limit_mb``."""
    root = script.resolve().parent
    limit = limit_mb * 2**20
    chosen: dict[str, Path] = {}
    sizes: dict[str, int] = {}
    for path in _walk(root):
        name = path.relative_to(root).as_posix()
        chosen[name], sizes[name] = path, path.stat().st_size
        if sum(sizes.values()) > limit:  # a script in a home directory: stop walking, say it at once
            raise _too_big(root, sizes, limit_mb)
    for path in extra:
        if not path.is_file():
            raise WorkdirError(f"--in {path}: no such file. Name a file to ship beside the script.")
        resolved = path.resolve()
        name = resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else resolved.name
        if name in chosen and chosen[name].resolve() != resolved:
            raise WorkdirError(f"--in {path}: the workdir already has a file {name}; rename one of them.")
        chosen[name], sizes[name] = resolved, resolved.stat().st_size
    if sum(sizes.values()) > limit:
        raise _too_big(root, sizes, limit_mb)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in chosen.items():
            archive.write(path, name)
    return Workdir(buffer.getvalue(), tuple(chosen), sum(sizes.values()))


def _too_big(root: Path, sizes: dict[str, int], limit_mb: float) -> WorkdirError:
    biggest = ", ".join(f"{name} ({size / 2**20:.1f} MB)"
                        for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:3])
    return WorkdirError(
        f"the script's directory {root} holds at least {sum(sizes.values()) / 2**20:.1f} MB to ship, over the "
        f"{limit_mb:g} MB cap for a workdir (largest: {biggest}). List big files in a .gitignore there (they "
        "stay home: read them where the script runs, e.g. from object storage), move the script to a smaller "
        "directory, or raise the cap with --max-workdir-mb.")
