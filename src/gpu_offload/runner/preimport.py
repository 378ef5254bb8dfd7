"""Importing a cell's slow modules while the runner waits for its bundle (``--preimport torch``).

A one-shot runner on a cluster starts before its bundle arrives: the pod runs, the kernel learns so and
attaches, and only then writes the bundle. The engine names on the command line the modules the cell imports
before any code of its own runs (``import torch`` at its top, or torch as a module input: the engine's
``preimport.chosen``); the runner imports them in a thread from its start, and the run waits for that thread
before anything of the cell happens, where the cell would have made the import itself.

The import sees what the cell's own would have seen: the process's environment and import hooks are set
first (``runtime.prepare_imports``), no code of the cell has run, and nothing changes either until the run
waited. Warnings the import raised are shown as the cell's own, and an import that failed fails the cell's
import of that module with the same exception (it is not tried again: a half-done import of an extension
module need not be repeatable). What a module writes to the process's file descriptors while it is imported
before the run began is not the cell's output (docs/runner-protocol.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import re
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_modules(value: str) -> tuple[str, ...]:
    """``torch`` or ``torch,numpy`` -> the module names; ``ValueError`` naming a bad one."""
    names = tuple(name for name in value.split(",") if name)
    bad = [name for name in names if not MODULE_NAME.fullmatch(name)]
    if bad or not names:
        raise ValueError(f"--preimport {value!r}: give module names separated by commas (e.g. torch)")
    return names


class Preimport:
    """The thread importing ``modules``, started at once."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = tuple(modules)
        self.failures: dict[str, BaseException] = {}
        self.caught: list[warnings.WarningMessage] = []
        self._thread = threading.Thread(target=self._work, name="gpu-offload-preimport", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        # record=True swaps only how warnings are shown (not the filters): the run shows them as the cell's
        with warnings.catch_warnings(record=True) as caught:
            for name in self.modules:
                try:
                    importlib.import_module(name)
                except BaseException as exc:  # noqa: BLE001 - whatever the import raised is the cell's to see
                    self.failures[name] = exc
        self.caught = caught

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def settle(self) -> float:
        """Wait for the imports (a Ctrl-C still interrupts the wait), then show their warnings and arm their
        failures for the cell's own imports; the seconds waited."""
        began = time.perf_counter()
        # one wait, no polling: every wake-up of this thread would take the GIL from the import; the wait
        # still ends at a Ctrl-C (a lock's acquire is interrupted by signals on POSIX)
        self._thread.join()
        for message in self.caught:
            warnings.showwarning(message.message, message.category, message.filename, message.lineno,
                                 message.file, message.line)
        self.caught = []
        for name, exc in self.failures.items():
            sys.meta_path.insert(0, _Failed(name, exc))
        self.failures = {}
        return time.perf_counter() - began


class _Failed(importlib.abc.MetaPathFinder):
    """Raises what the pre-import of ``name`` raised, at the first import of it, then steps aside."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name, self.exc = name, exc

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        raise self.exc
