"""What a cell reads and writes, found from its syntax tree before anything runs.

Inputs are the global names the cell reads that exist in the user namespace (plus ``--in``); modules among
them are imported again remotely by name rather than pickled. Outputs are the names the cell binds at top
level (plus ``--out``). Syntax errors and IPython syntax (``%magic``, ``!cmd``) are reported here, with the
line, so nothing is launched for a cell that cannot run.

What the syntax tree says (the names read and bound, the imports) depends on the cell's text alone, so it is
kept per text (:func:`cell_syntax`): a warm cell run again skips the parse and the walks. What depends on the
notebook (which names exist, which are modules) is looked up again at every run.
"""

from __future__ import annotations

import ast
import functools
import types
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CellSyntaxError, OffloadUsageError

_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class CellAnalysis:
    """The data flow of one cell."""

    inputs: tuple[str, ...]
    """Names whose values are pickled and sent (never modules)."""
    modules: Mapping[str, str] = field(default_factory=dict)
    """Local name -> module name, for module inputs imported again on the runner."""
    outputs: tuple[str, ...] = ()
    """Names to copy back after a successful run."""
    required_outputs: tuple[str, ...] = ()
    """Outputs the user named with ``--out``: failing to copy one is an error."""
    imports: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    """Names the cell binds with an absolute import, outside functions and classes: name -> (module, attribute
    or None). The kernel imports them itself where a value cannot travel (from an untrusted cluster)."""
    leading_imports: tuple[str, ...] = ()
    """The modules the cell's first statements import, in order, before any other code of it runs."""


@dataclass(frozen=True)
class CellSyntax:
    """What a cell's text alone says about its data flow (no namespace needed)."""

    reads: tuple[str, ...]
    """Global names the cell reads, in order of first use."""
    writes: tuple[str, ...]
    """Names the cell binds at top level, in order of first binding."""
    imports: Mapping[str, tuple[str, str | None]]
    """As :attr:`CellAnalysis.imports` (a read-only view: every analysis of the text shares it)."""
    leading_imports: tuple[str, ...] = ()
    """As :attr:`CellAnalysis.leading_imports`."""


SYNTAX_CACHE = 256
"""Cell texts whose syntax is kept: a notebook re-runs a few cells many times."""


@functools.lru_cache(maxsize=SYNTAX_CACHE)
def cell_syntax(cell: str, line_offset: int = 1) -> CellSyntax:
    """The names ``cell`` reads and binds and its imports, parsed once per text and kept (:data:`SYNTAX_CACHE`
    texts, the least recently used dropped first). Raises as :func:`parse_cell` does; a cell that does not
    parse is not kept, so its error is raised again at every run."""
    tree = parse_cell(cell, line_offset)
    reads, writes = _NameFlow.of(tree)
    return CellSyntax(tuple(reads), tuple(writes), types.MappingProxyType(cell_imports(tree)), leading_imports(tree))


def parse_cell(cell: str, line_offset: int = 1) -> ast.Module:
    """Parse ``cell`` or raise a usage error naming the line (``line_offset`` lines precede the body)."""
    try:
        return ast.parse(cell, filename="<offloaded cell>")
    except SyntaxError as err:
        ipython_line = _first_ipython_line(cell)
        if ipython_line is not None:
            number, text = ipython_line
            raise OffloadUsageError(
                f"Line {number + line_offset} of the cell is IPython syntax, which the remote runner "
                f"cannot run: `{text.strip()}`. Nothing was launched. Move it to a cell of its own "
                "without %%gpu_offload, or write it in plain Python (e.g. subprocess.run for !cmd)."
            ) from None
        same_line = err.end_lineno in (None, err.lineno)
        raise CellSyntaxError((err.lineno or 1) + line_offset, err.text or "", err.offset or 0,
                              (err.end_offset or 0) if same_line else 0, err.msg) from None


def _first_ipython_line(cell: str) -> tuple[int, str] | None:
    # IPython's own transformer knows its syntax (and leaves strings alone); a line it rewrites is one
    # plain Python cannot run.
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        transformed = TransformerManager().transform_cell(cell)
    except SyntaxError:
        return None
    if transformed.rstrip() == cell.rstrip():
        return None
    for number, (before, after) in enumerate(
        zip(cell.splitlines(), transformed.splitlines(), strict=False), start=1
    ):
        if before != after:
            return number, before
    return None


def analyse_cell(
    cell: str,
    namespace: Mapping[str, Any],
    *,
    hidden: Collection[str] = (),
    extra_inputs: Iterable[str] = (),
    extra_outputs: Iterable[str] = (),
    line_offset: int = 1,
) -> CellAnalysis:
    """Find the inputs, module inputs and outputs of ``cell`` against the user ``namespace``.

    ``hidden`` names (IPython's own entries such as ``In``/``Out``/``get_ipython``) are never sent.
    An ``--in`` name missing from the namespace is a usage error.
    """
    syntax = cell_syntax(cell, line_offset)
    extra_inputs = tuple(extra_inputs)
    for name in extra_inputs:
        if name not in namespace:
            raise OffloadUsageError(
                f"--in {name}: there is no variable `{name}` in the notebook. Define it in a cell above, "
                "or drop it from --in."
            )
    wanted = [n for n in syntax.reads if n in namespace and n not in hidden and not n.startswith("__")]
    inputs: list[str] = []
    modules: dict[str, str] = {}
    for name in _unique([*wanted, *extra_inputs]):
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        else:
            inputs.append(name)
    required = _unique(extra_outputs)
    return CellAnalysis(
        inputs=tuple(inputs),
        modules=modules,
        outputs=tuple(_unique([*syntax.writes, *required])),
        required_outputs=tuple(required),
        imports=dict(syntax.imports),
        leading_imports=syntax.leading_imports,
    )


def leading_imports(tree: ast.Module) -> tuple[str, ...]:
    """The modules imported by the cell's first statements, up to its first statement of another kind (a
    docstring aside) or a relative import: nothing of the cell runs before them."""
    found: list[str] = []
    for index, node in enumerate(tree.body):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif not (index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str)):
            break
    return tuple(found)


def cell_imports(tree: ast.Module) -> dict[str, tuple[str, str | None]]:
    """What each name bound by an absolute import at the cell's level refers to (later imports win)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    found: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import a.b` binds `a`; `import a.b as c` binds the submodule
                found[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else
                                                                   alias.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


class _NameFlow(ast.NodeVisitor):
    """Global names read anywhere, and names bound at the top level (scope-aware, conservative)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.writes: list[str] = []
        # one set of local names per enclosing function/comprehension scope
        self.scopes: list[set[str]] = []

    @classmethod
    def of(cls, tree: ast.Module) -> tuple[list[str], list[str]]:
        flow = cls()
        flow.visit(tree)
        return _unique(flow.reads), _unique(flow.writes)

    def _bind(self, name: str) -> None:
        if not self.scopes:
            self.writes.append(name)

    def _read(self, name: str) -> None:
        if not any(name in scope for scope in self.scopes):
            self.reads.append(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)
        else:
            self._bind(node.id)
            if isinstance(node.ctx, ast.Del):
                self._read(node.id)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        # `x += 1` reads x as well as binding it
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import  # noqa: N815

    def visit_Global(self, node: ast.Global) -> None:
        # a function declaring `global x` and assigning it binds x at the top level when called
        self.writes.extend(node.names)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        # Python deletes the `as` name when the handler ends, so it is never an output
        if node.type is not None:
            self.visit(node.type)
        for statement in node.body:
            self.visit(statement)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for item in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(item)
        self._bind(node.name)
        # class bodies read globals like any code; their own bindings are class attributes
        self.scopes.append(_local_names(node.body))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for item in [*node.decorator_list, *_defaults(node.args)]:
            self.visit(item)
        if node.returns is not None:
            self.visit(node.returns)
        self._bind(node.name)
        self._enter_function(node.args, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for item in _defaults(node.args):
            self.visit(item)
        self._enter_function(node.args, [node.body])

    def _enter_function(self, args: ast.arguments, body: list[ast.stmt] | list[ast.expr]) -> None:
        self.scopes.append(_argument_names(args) | _local_names(body))
        for statement in body:
            self.visit(statement)
        self.scopes.pop()

    def _visit_comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
    ) -> None:
        # the first iterable is evaluated in the enclosing scope
        self.visit(node.generators[0].iter)
        targets: set[str] = set()
        for generator in node.generators:
            targets |= {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}
        self.scopes.append(targets)
        for index, generator in enumerate(node.generators):
            if index:
                self.visit(generator.iter)
            for condition in generator.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension  # noqa: N815


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _argument_names(args: ast.arguments) -> set[str]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return {a.arg for a in every}


def _local_names(body: list[ast.stmt] | list[ast.expr]) -> set[str]:
    """Names bound directly in a function body (not in nested scopes), minus global/nonlocal ones."""
    bound: set[str] = set()
    declared: set[str] = set()
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, (*_FUNCTION_SCOPES, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                bound.add(node.name)
            continue
        elif isinstance(node, _COMPREHENSIONS):
            continue
        pending.extend(ast.iter_child_nodes(node))
    return bound - declared
