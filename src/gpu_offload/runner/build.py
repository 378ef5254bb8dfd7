"""Build the runner zipapp: this package plus cloudpickle and pynvml, runnable by any same-minor Python.

Stock images (an official PyTorch image, say) have neither this project nor cloudpickle, so the runner
carries what it imports. The archive is cached per user under a name derived from a hash of its contents,
so a change of the runner or of a carried library makes a new file, and concurrent kernels never see a
half-written one (it is written to a temporary name and renamed into place).
"""

from __future__ import annotations

import hashlib
import os
import py_compile
import shutil
import sys
import tempfile
import zipapp
from collections.abc import Iterator
from pathlib import Path

PACKAGE_NAME = "gpo_runner"
"""The runner package's name inside the zipapp (it does not depend on where this package lives)."""
SHARDS_MODULE = "gpo_shards.py"
"""``src/gpu_offload/engine/shards.py`` inside the zipapp: a top-level module the cell imports."""
_LEFT_OUT = {"build.py"}
_ENTRY = f"import sys\nfrom {PACKAGE_NAME}.__main__ import main\nsys.exit(main())\n"  # building needs the whole project; the runner never builds itself


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gpu-offload``, else ``~/.cache/gpu-offload``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpu-offload"


def _sources() -> Iterator[tuple[str, Path]]:
    """(path inside the archive, file on disk) for every file the runner needs, in a stable order."""
    import cloudpickle
    import pynvml

    runner = Path(__file__).resolve().parent
    for path in sorted(runner.glob("*.py")):
        if path.name not in _LEFT_OUT:
            yield f"{PACKAGE_NAME}/{path.name}", path
    carried = Path(cloudpickle.__file__).resolve().parent
    for path in sorted(carried.rglob("*.py")):
        yield f"cloudpickle/{path.relative_to(carried).as_posix()}", path
    nvml = Path(pynvml.__file__).resolve()
    yield nvml.name, nvml
    # importable by the cell as ``gpo_shards`` (the archive is on sys.path): the cell's helper for ranks of
    # different speeds, which a stock image cannot import from gpu_offload
    yield SHARDS_MODULE, runner.parent / "engine" / "shards.py"


def content_hash() -> str:
    """A hash of the names and bytes of everything the archive holds."""
    digest = hashlib.sha256()
    for name, path in _sources():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(sys.implementation.cache_tag.encode())  # the archive holds bytecode for this Python
    return digest.hexdigest()[:16]


def _precompile(source: Path, name: str) -> None:
    """Put ``x.pyc`` beside ``x.py``: zipimport cannot cache bytecode, and compiling pynvml and
    cloudpickle on every start costs most of a cold start. Unchecked-hash pycs need no source mtime;
    another Python version rejects their magic number and compiles the source instead."""
    py_compile.compile(
        str(source),
        cfile=str(source.with_suffix(".pyc")),
        dfile=name,  # tracebacks name e.g. gpo_runner/execute.py
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def build_runner(directory: Path | None = None) -> Path:
    """Return the path of the runner zipapp, building it if this content has not been built yet."""
    target_dir = Path(directory) if directory is not None else cache_dir()
    target = target_dir / f"runner-{content_hash()}.pyz"
    if target.exists():
        return target
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeError(
            f"cannot create the runner cache {target_dir}: {exc.strerror}; set XDG_CACHE_HOME to a "
            "writable directory"
        ) from exc
    with tempfile.TemporaryDirectory(prefix="gpuo-runner-", dir=target_dir) as staging:
        tree = Path(staging) / "tree"
        for name, path in _sources():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, tree / name)
            _precompile(tree / name, name)
        # our own entry point (zipapp's generated one drops main()'s return value, i.e. the exit code)
        (tree / "__main__.py").write_text(_ENTRY)
        partial = Path(staging) / "runner.pyz"
        zipapp.create_archive(tree, partial, compressed=True)
        # rename is atomic: a kernel building at the same time replaces it with identical bytes
        os.replace(partial, target)
    return target
