"""Running one bundle's cell: modules, inputs, compile, exec, last-expression display, outputs.

Errors the user must see become ``error`` frames and a :class:`CellFailed`; output already streamed stays
where it is. Tracebacks are cut to start at the cell's own frame and name the notebook's line numbers.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from . import buffers, display, outputs, script
from .failures import CellFailed, fail

Emit = Callable[..., None]

SMALL_INPUTS = 64 * 1024
"""Inputs smaller than this load in well under a millisecond: no progress frame for them."""
_IPYTHON_LINE = re.compile(r"^\s*(?:[\w.,\s\[\]]+=\s*)?[%!]")


def run_cell(emit: Emit, bundle: dict[str, Any], namespace: dict[str, Any], *, shared_inputs: bool = False,
             imported: float = 0.0) -> None:
    """Everything between ``hello`` and ``done`` for one bundle; raises :class:`CellFailed` on failure.

    ``shared_inputs``: other processes (the other ranks of a distributed run) read the same input files.
    ``imported``: seconds the run already waited for modules imported ahead (:mod:`.preimport`).
    """
    code, last = compile_cell(emit, bundle)
    # status frames only for steps that have work: a warm trivial cell should cost few writes
    if bundle["modules"]:
        emit("status", state="importing modules")
        began = time.perf_counter()
        import_modules(emit, bundle["modules"], namespace)
        imported += time.perf_counter() - began
    if bundle["buffers"] or len(bundle["inputs"] or b"") > SMALL_INPUTS:
        emit("status", state="loading inputs")
    load_inputs(emit, bundle, namespace, shared=shared_inputs)
    emit("status", state="running", imports=round(imported, 6))
    workdir = script.enter(bundle["script"], namespace) if bundle["script"] else None
    try:
        exec(code, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                data, meta = display.mime_bundle(value)
                emit("display_data", data=data, metadata={**meta, "execute_result": True})
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a cell's sys.exit() ends the cell, not the runner
        if not script.clean_exit(bundle["script"], exc):
            raise fail(emit, type(exc).__name__, str(exc), cell_traceback(exc, bundle["filename"])) from None
    finally:
        _show_figures()
        if workdir is not None:
            script.leave(workdir)
    outputs.send(emit, bundle, namespace)


def _show_figures() -> None:
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and "mpl_backend" in str(pyplot.get_backend()):
        display.show_open_figures()


COMPILED_KEPT = 64
"""Cells whose code objects a runner keeps: a warm session runs the same few cells again and again."""
_COMPILED: dict[tuple[str, int, bool], tuple[Any, Any, str]] = {}


def compile_cell(emit: Emit, bundle: dict[str, Any]) -> tuple[Any, Any]:
    """Compile the cell with the notebook's file name and line numbers; the last expression separately.

    Code objects are immutable and a run makes its own functions and values from them, so a session keeps
    them per cell text (and first line, and whether it runs as a script): a cell run again is not compiled
    again, only renamed when the notebook gave it another name (``In[N]`` moves on at every run).
    """
    import linecache

    cell, filename, first = bundle["cell"], bundle["filename"], bundle["first_line"]
    # tracebacks read source through linecache: pad so that line N of the cell is line N + first - 1
    lines = [""] * (first - 1) + cell.splitlines(keepends=True)
    linecache.cache[filename] = (len(cell), None, lines, filename)
    key = (cell, first, not bundle["script"])
    kept = _COMPILED.pop(key, None)
    if kept is None:
        code, last = _compile(emit, cell, filename, first, script=bool(bundle["script"]))
        while len(_COMPILED) >= COMPILED_KEPT:
            del _COMPILED[next(iter(_COMPILED))]
    else:
        code, last, named = kept
        if named != filename:
            code, last = _renamed(code, filename), None if last is None else _renamed(last, filename)
    _COMPILED[key] = (code, last, filename)  # re-inserted: the dict's order is the order of last use
    return code, last


def _compile(emit: Emit, cell: str, filename: str, first: int, *, script: bool) -> tuple[Any, Any]:
    # ast (which brings tokenize) is imported by the first cell, after the hello frame
    import ast

    try:
        tree = ast.parse(cell, filename, "exec")
    except SyntaxError as exc:
        raise _syntax_failure(emit, cell, first, exc) from None
    ast.increment_lineno(tree, first - 1)
    last = None
    # a script shows nothing of its last expression, as ``python script.py`` does
    tail = tree.body[-1] if tree.body else None
    if not script and isinstance(tail, ast.Expr) and not cell.rstrip().endswith(";"):
        tree.body.pop()
        last = compile(ast.Expression(tail.value), filename, "eval")
    return compile(tree, filename, "exec"), last


def _renamed(code: CodeType, filename: str) -> CodeType:
    """``code`` and the code objects it holds (its functions, classes, comprehensions) under ``filename``."""
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _syntax_failure(emit: Emit, cell: str, first: int, exc: SyntaxError) -> CellFailed:
    for number, line in enumerate(cell.splitlines(), start=first):
        if _IPYTHON_LINE.match(line):
            return fail(
                emit,
                "UsageError",
                f"line {number}: `{line.strip()}` is IPython syntax, but an offloaded cell runs as plain "
                "Python: run magics and shell commands in a normal cell, or use subprocess.run([...]) "
                "inside the offloaded cell",
            )
    if exc.lineno is not None:
        exc.lineno += first - 1
    import traceback

    return fail(emit, "SyntaxError", str(exc), traceback.format_exception_only(type(exc), exc))


def import_modules(emit: Emit, modules: dict[str, str], namespace: dict[str, Any]) -> None:
    """Import the cell's module inputs again where it runs (modules are never pickled)."""
    for local, module in modules.items():
        try:
            namespace[local] = importlib.import_module(module)
        except ImportError as exc:
            raise fail(
                emit,
                type(exc).__name__,
                f"module `{module}` (`{local}` in the notebook) cannot be imported where the cell runs: "
                f"{exc}; use an image that has it installed (--image), or install it in the cell",
            ) from None


def load_inputs(emit: Emit, bundle: dict[str, Any], namespace: dict[str, Any], *, shared: bool = False) -> None:
    """Unpickle the cell's inputs into ``namespace``; shm inputs are mapped shared (see :mod:`.handover`).

    ``shared``: other processes read the same files, so each maps them copy-on-write (one rank's in-place
    change must not reach another's data) and leaves their names to the engine, which removes them after
    the run.
    """
    if bundle["inputs"] is None:
        if not shared:
            buffers.discard(bundle["buffers"])
        return
    try:
        if shared:
            values = buffers.load(bundle["inputs"], bundle["buffers"], keep=True)
        else:
            values = buffers.load(bundle["inputs"], bundle["buffers"], share=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise fail(
            emit,
            type(exc).__name__,
            f"the cell's inputs cannot be loaded where it runs: {exc}; a library an input needs may be "
            "missing or of another version there: use an image that matches the notebook's environment",
            cell_traceback(exc, ""),
        ) from None
    namespace.update(values)


def cell_traceback(exc: BaseException, filename: str) -> list[str]:
    """The formatted traceback of the cell's own frames: from the cell's first frame on, and without the
    runner's frames (e.g. the signal handler that raised a KeyboardInterrupt) at the end."""
    import traceback  # only a failed cell needs it (it brings linecache and tokenize)

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    summary = traceback.TracebackException(type(exc), exc, tb)
    kept, entry = [], tb
    for frame in summary.stack:  # one FrameSummary per traceback entry, in the same order
        assert entry is not None
        if entry.tb_frame.f_globals.get("__package__") != __package__:
            kept.append(frame)
        entry = entry.tb_next
    summary.stack = traceback.StackSummary.from_list(kept)
    return list(summary.format())
