"""The bundle: everything one offloaded cell needs, as a stdlib pickle of plain types.

Plain types (no classes of this package) so that any Python of the same minor version can read it without
this package installed. :func:`make_bundle` is what the engine calls; :func:`parse_bundle` what the runner
calls, checking the fields before anything runs.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import buffers

BUNDLE_VERSION = 1


class BundleError(ValueError):
    """The bundle is unreadable or lacks a field; the message says which and what to do."""


def make_bundle(
    cell: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    input_transport: str = "shm",
    modules: Mapping[str, str] | None = None,
    outputs: Iterable[str] = (),
    required_outputs: Iterable[str] = (),
    output_transport: str = "shm",
    shm_dir: str | None = None,
    output_urls: Sequence[str] = (),
    output_format: str = "pickle",
    input_urls: Sequence[str] = (),
    filename: str = "<offloaded cell>",
    first_line: int = 1,
    metrics_interval: float = 1.0,
    env: Mapping[str, str] | None = None,
    nonce: str | None = None,
    run_id: str | None = None,
    python: str | None = None,
    script: Mapping[str, Any] | None = None,
    log_url: str = "",
    ranks: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Build a bundle dict; ``inputs`` are pickled here (large buffers out of band via ``input_transport``).

    ``first_line`` is the notebook line number of the cell body's first line (2 below a ``%%`` magic line),
    so tracebacks name the lines the user sees. ``script`` runs ``cell`` as a script instead (see
    :mod:`.script`): argv, workdir and ``sys.exit`` codes as ``python SCRIPT`` would have them. ``log_url``
    (a presigned PUT URL) keeps the run's log in object storage (:mod:`.runlog`). ``output_format`` is ``pickle``
    or ``safe`` (the format of :mod:`.safe`, for a kernel that does not trust the cluster the runner is on).
    ``ranks`` (``{"nodes": N, "procs_per_node": P, "out_rank": R}``) makes it a distributed run (:mod:`.ranks`).
    """
    import secrets  # the engine's side only; the runner never makes bundles

    values = dict(inputs or {})
    # a cell without inputs sends none: no pickler made here, nothing unpickled on the runner (a warm cell's cost)
    dumped = buffers.dump(values, input_transport, shm_dir=shm_dir, urls=input_urls) if values else None
    return {
        "version": BUNDLE_VERSION,
        "run_id": run_id or secrets.token_hex(8),
        "nonce": nonce or secrets.token_hex(16),
        "python": python or f"{sys.version_info[0]}.{sys.version_info[1]}",
        "cell": cell,
        "filename": filename,
        "first_line": int(first_line),
        "modules": dict(modules or {}),
        "inputs": None if dumped is None else dumped.pickle,
        "buffers": [] if dumped is None else list(dumped.buffers),
        "outputs": list(outputs),
        "required_outputs": list(required_outputs),
        "output_transport": output_transport,
        "shm_dir": shm_dir,
        "output_urls": list(output_urls),
        "output_format": output_format,
        "metrics_interval": float(metrics_interval),
        "env": dict(env or {}),
        "script": None if script is None else dict(script),
        "log_url": log_url,
        "ranks": None if ranks is None else dict(ranks),
    }


def encode_bundle(bundle: Mapping[str, Any]) -> bytes:
    """The bytes to write to the bundle file (or Secret)."""
    return pickle.dumps(dict(bundle), protocol=5)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "run_id": str,
    "nonce": str,
    "python": str,
    "cell": str,
    "filename": str,
    "first_line": int,
    "modules": dict,
    "inputs": (bytes, bytearray),
    "buffers": list,
    "outputs": list,
    "required_outputs": list,
    "output_transport": str,
    "output_urls": list,
    "output_format": str,
    "metrics_interval": (int, float),
    "env": dict,
    "script": dict,
    "log_url": str,
    "ranks": dict,
}
_REQUIRED = ("version", "nonce", "python", "cell")
_DEFAULTS: dict[str, Any] = {
    "run_id": "",
    "filename": "<offloaded cell>",
    "first_line": 1,
    "modules": {},
    "inputs": None,
    "buffers": [],
    "outputs": [],
    "required_outputs": [],
    "output_transport": "shm",
    "shm_dir": None,
    "output_urls": [],
    "output_format": "pickle",
    "metrics_interval": 1.0,
    "env": {},
    "script": None,
    "log_url": "",
    "ranks": None,
}


def parse_bundle(data: bytes, source: str = "bundle") -> dict[str, Any]:
    """Load and check a bundle; raise :class:`BundleError` naming ``source`` and the problem."""
    try:
        bundle = pickle.loads(data)
    except Exception as exc:
        raise BundleError(
            f"{source} is not a readable bundle ({type(exc).__name__}: {exc}); "
            "write it with gpu_offload.runner.bundle.encode_bundle"
        ) from exc
    if not isinstance(bundle, dict):
        raise BundleError(f"{source} holds a {type(bundle).__name__}, not a bundle dict; use encode_bundle")
    missing = [key for key in _REQUIRED if key not in bundle]
    if missing:
        raise BundleError(f"{source} lacks {', '.join(missing)}; build it with make_bundle")
    if bundle["version"] != BUNDLE_VERSION:
        raise BundleError(
            f"{source} has version {bundle['version']!r}, this runner reads version {BUNDLE_VERSION}; "
            "engine and runner must come from the same jupyter-gpu-offload release"
        )
    full = {**_DEFAULTS, **bundle}
    for key, expected in _TYPES.items():
        if full[key] is not None and not isinstance(full[key], expected):
            raise BundleError(
                f"{source}: field {key!r} is a {type(full[key]).__name__}; build it with make_bundle"
            )
    return full


def read_bundle(path: str) -> dict[str, Any]:
    """Read and check the bundle file at ``path``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise BundleError(
            f"cannot read bundle {path}: {exc.strerror}; check the path passed to --bundle"
        ) from exc
    return parse_bundle(data, f"bundle {path}")
