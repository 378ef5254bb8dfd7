"""The package layout, read from setup.py's ROOTS (the one place the folder-to-package map is written).

Used by .ci/typecheck-tree.py (the tree mypy and import-linter read), tests/test_layout.py (the map holds and
the README's table is this one) and ``python .ci/layout.py --readme`` (rewrites that table in README.md).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- layout table: python .ci/layout.py --readme -->"
END = "<!-- end of layout table -->"
OTHER_FOLDERS = {
    "helm/": "the Helm charts: the origin's (JupyterHub on zero-to-jupyterhub) and the donor's",
    "images/": "recipes of the hub, user server and runner images, and `build.sh` ([images/README.md](images/README.md))",
    "tests/": "tests, mirroring the packages (`tests/engine/`, `tests/sandbox/kubelet/`, ...)",
    "bench/": "benchmarks on one harness (`bench/harness.py`); figures in [bench/RESULTS.md](bench/RESULTS.md) "
              "(generated), findings in [bench/FINDINGS.md](bench/FINDINGS.md)",
    "jupyter-config/": "enables the runs REST API in Jupyter servers",
    "examples/": "`quickstart.ipynb`, the main job; `queueing.ipynb`, waiting and preemption",
    "docs/": "user, admin and contributor guides (listed below; the layers in docs/architecture.md)",
    ".ci/": "`run` (CI runs the README's test command), this table's generator, the node packages the tests install",
}


def roots() -> dict[str, str]:
    """setup.py's ROOTS (package -> folder), read from its syntax tree without running setup()."""
    return roots_of(ROOT)


def roots_of(checkout: Path) -> dict[str, str]:
    """The ROOTS of the setup.py in ``checkout`` (another revision's worktree, say)."""
    tree = ast.parse((checkout / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ROOTS" for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise SystemExit("setup.py has no ROOTS")


def _summary(folder: Path) -> str:
    """The first sentence of a package's docstring (its ``__init__.py``)."""
    init = folder / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
    if not doc:
        raise SystemExit(f"{folder.relative_to(ROOT)}/__init__.py needs a docstring: its first line goes in the README")
    first = " ".join(doc.split("\n\n")[0].split())
    first = re.sub(r":\w+:`([^`]+)`", r"`\1`", first.replace("``", "`"))  # reST roles and literals as Markdown
    return first.split(". ")[0].rstrip(".").replace("|", "\\|")


def packages(depth: int = 2) -> list[tuple[str, str, str]]:
    """(folder, import name, summary) of every ``gpu_offload`` package down to ``depth`` dots in its name.

    A package is a folder with an ``__init__.py``; Metaflow's namespace folder is listed as its root only.
    """
    mapped = roots()
    rows = []
    for name, folder in mapped.items():
        if not name.startswith("gpu_offload"):
            continue
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            path = init.parent
            dotted = ".".join([name, *path.relative_to(ROOT / folder).parts])
            inside_other_root = any(ROOT / other in (path, *path.parents) and len(other) > len(folder)
                                    for other in mapped.values())
            if dotted.count(".") <= depth and not inside_other_root:
                rows.append((f"{path.relative_to(ROOT).as_posix()}/", dotted, _summary(path)))
    rows.sort(key=lambda row: row[1])
    for name, folder in mapped.items():
        if not name.startswith("gpu_offload"):
            rows.append((f"{folder}/", name, "the shim through which Metaflow finds `@gpu_offload` (Metaflow's rule: "
                         "a top-level namespace package)"))
    return rows


def table() -> str:
    """The README's layout table: every package two levels deep, then the folders that are not packages."""
    lines = ["| folder | import name | what it holds |", "|---|---|---|"]
    lines += [f"| `{folder}` | `{name}` | {summary} |" for folder, name, summary in packages()]
    lines += [f"| `{folder}` | | {what} |" for folder, what in OTHER_FOLDERS.items()]
    return "\n".join(lines)


def readme_with_table(readme: str) -> str:
    """``readme`` with the text between the markers replaced by :func:`table`."""
    head, found, rest = readme.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"README.md lacks the markers {BEGIN!r} and {END!r} around the layout table")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        path = ROOT / "README.md"
        path.write_text(readme_with_table(path.read_text()))
    else:
        print(table())
