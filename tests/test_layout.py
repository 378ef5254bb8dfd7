"""The distribution exposes one namespace built from the user's fixed layout."""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The folder-to-package map is written once, in setup.py's ROOTS; .ci/layout.py reads it for everyone.
_spec = importlib.util.spec_from_file_location("layout", REPO / ".ci" / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)
ROOTS = layout.roots()


@pytest.mark.parametrize("package, folder", [(p, f) for p, f in ROOTS.items() if p.startswith("gpu_offload")])
def test_each_folder_is_a_subpackage_of_gpu_offload(package: str, folder: str) -> None:
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().parent == REPO / folder


def test_the_fixed_top_level_folders_are_packages_of_their_own() -> None:
    # the layout the project promises: these folders stay where they are, each its own package
    assert {folder for folder in ROOTS.values()} >= {"magics", "liqo_peering", "flows", "hub_extension", "sandbox"}


def test_the_readme_layout_table_is_the_one_the_tree_gives() -> None:
    readme = (REPO / "README.md").read_text()
    assert layout.readme_with_table(readme) == readme, "run: python .ci/layout.py --readme"
    for folder, name, _ in layout.packages():
        assert (REPO / folder / "__init__.py").exists() or name == "metaflow_extensions", folder


def test_cli_prints_help_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_offload.cli import main

    assert main([]) == 2
    assert "gpu-offload" in capsys.readouterr().out


def _private_reaches(tree: ast.AST) -> list[str]:
    """Private names a module takes from elsewhere: imported, or read as an attribute of anything but itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") + [alias.name for alias in node.names]
            found += [f"line {node.lineno}: import {p}" for p in parts if p.startswith("_") and not p.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and str(node.args[1].value).startswith("_")):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")  # the same reach, spelled as a string
    return found


def test_the_dashboard_reads_the_magic_through_public_names_only() -> None:
    # import-linter contracts name modules, not attributes: what the panel (and the run book it shares with
    # the commands, once part of it) reads of the magic, its backends and runs (magic._backends,
    # run.inner.current.ctx...) is checked here on the syntax tree instead
    reaches = {
        str(path.relative_to(REPO)): found
        for path in sorted([*(REPO / "magics" / "dashboard").glob("*.py"),
                            *(REPO / "src" / "gpu_offload" / "engine" / "runs").glob("*.py")])
        if (found := _private_reaches(ast.parse(path.read_text())))
    }
    assert reaches == {}
