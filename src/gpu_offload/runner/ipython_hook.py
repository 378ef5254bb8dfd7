"""Where IPython happens to be installed, its ``display()`` is the runner's too.

Without a running IPython shell, ``IPython.display.display`` just prints the repr, so a cell doing
``from IPython.display import display, HTML`` would show text on an image with IPython and rich output
nowhere. An import hook swaps in the runner's shim when IPython's module is first imported (importing
IPython up front would cost every cold start a few hundred milliseconds).
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .display import display

TARGET = "IPython.core.display_functions"


class _Finder:  # a meta path finder by protocol: importlib.abc costs a cold start ~20 ms
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
        return spec


class _Loader:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        # before IPython.display's `from ... import *` copies the name
        module.display = display  # type: ignore[attr-defined]


def install() -> None:
    """Install the hook (or patch at once if IPython's display module is already imported)."""
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        loaded.display = display  # type: ignore[attr-defined]
        shown = sys.modules.get("IPython.display")
        if shown is not None:
            shown.display = display  # type: ignore[attr-defined]
        return
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
