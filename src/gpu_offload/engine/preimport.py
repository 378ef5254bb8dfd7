"""Which modules a cell's runner imports while its bundle is on its way (the runner's ``--preimport``).

A cell that starts with ``import torch`` spends seconds in that import. A runner of its own starts before its
bundle arrives (on a cluster the kernel first learns that the pod runs, then attaches to write the bundle), so
it can import torch in the meantime. It does so only where that cannot change what the cell sees: torch is a
module input (imported before the cell runs in any case) or imported by the cell's first statements, with
nothing before it but imports of modules that change neither the environment nor the import machinery.
"""

from __future__ import annotations

import sys

from .analysis import CellAnalysis

PREIMPORTED = ("torch",)
"""Slow to import (torch: 1.3-2 s of CPU on a 2-core machine) and importable the same from any thread."""
INERT = frozenset({"numpy", "pandas", "scipy"})
"""Besides the standard library: modules a cell commonly imports before torch whose import leaves the
environment and the import hooks as they were."""


def chosen(analysis: CellAnalysis) -> tuple[str, ...]:
    """The modules of :data:`PREIMPORTED` the cell imports before any code of its own runs, in order."""
    wanted: list[str] = []
    for module in (*analysis.modules.values(), *analysis.leading_imports):
        top = module.partition(".")[0]
        if top in PREIMPORTED:
            if top not in wanted:
                wanted.append(top)
        elif top not in sys.stdlib_module_names and top not in INERT:
            break  # its import may run code that changes what torch's import would find
    return tuple(wanted)
