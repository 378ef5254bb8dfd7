"""A script instead of a cell: the bundle's ``script`` field says how to run it as ``python SCRIPT ARGS`` would.

``script`` is ``{"path": "train.py", "argv": ["--epochs", "3"], "workdir": <zip bytes>}``. The workdir (the
script's directory, shipped by ``gpu-offload run``) is unpacked into a fresh directory that becomes the
current directory and ``sys.path[0]``, so the script's local imports and small data files work where it
runs. ``sys.argv``, ``__file__`` and ``__name__ == "__main__"`` are what the script would see at home.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any


def enter(script: dict[str, Any], namespace: dict[str, Any]) -> str:
    """Unpack the workdir and make it the script's world; returns the directory (removed by :func:`leave`)."""
    # imported here, not at the top: a cell (most runs) never needs them, and zipfile alone brings
    # shutil, bz2, lzma and random into a cold start
    import tempfile
    import zipfile

    root = tempfile.mkdtemp(prefix="gpuo-workdir-")
    data = script.get("workdir") or b""
    if data:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            archive.extractall(root)  # zipfile drops absolute paths and '..' from member names
    path = os.path.join(root, str(script["path"]))
    os.chdir(root)
    sys.path.insert(0, root)
    sys.argv = [str(script["path"]), *(str(arg) for arg in script.get("argv") or ())]
    namespace["__file__"] = path
    return root


def leave(root: str) -> None:
    """Leave the unpacked workdir and remove it (a one-shot runner ends next; a session must not keep it)."""
    import shutil
    import tempfile

    os.chdir(tempfile.gettempdir())
    if root in sys.path:
        sys.path.remove(root)
    shutil.rmtree(root, ignore_errors=True)


def clean_exit(script: dict[str, Any] | None, exc: BaseException) -> bool:
    """Whether ``exc`` ends a script successfully: ``sys.exit()`` or ``sys.exit(0)``, as Python's own exit."""
    return script is not None and isinstance(exc, SystemExit) and exc.code in (None, 0)
