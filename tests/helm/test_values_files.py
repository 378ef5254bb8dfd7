"""No values file in the repository declares a key twice.

YAML parsers keep one of two equal keys silently (Helm keeps the last): a second `labels:` under
grafanaDashboard once replaced the first and left serviceMonitor without its own. This loader refuses them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


class _UniqueKeys(yaml.SafeLoader):
    """A SafeLoader that fails on a mapping key seen twice, naming the key and both lines."""


def _construct_mapping(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is declared twice (lines {seen[key]} and {line})", key_node.start_mark)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_unique(text: str) -> list[Any]:
    """Every document of ``text``, refusing duplicate keys."""
    return list(yaml.load_all(text, Loader=_UniqueKeys))  # noqa: S506 - a SafeLoader subclass


def _values_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*values*.yaml", "*values*.yml"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    return sorted(REPO / name for name in listed)


@pytest.mark.e2e  # starts a process
def test_the_repository_has_values_files() -> None:
    assert REPO / "helm" / "gpu-offload" / "values.yaml" in _values_files()


@pytest.mark.parametrize("path", _values_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_key_is_declared_twice(path: Path) -> None:
    load_unique(path.read_text())


def test_the_loader_refuses_the_duplicate_it_exists_for() -> None:
    text = "metrics:\n  grafanaDashboard:\n    labels: {a: '1'}\n    labels: {}\n"
    with pytest.raises(yaml.constructor.ConstructorError, match=r"'labels' is declared twice \(lines 3 and 4\)"):
        load_unique(text)
    assert load_unique("a: {labels: {}}\nb: {labels: {}}\n")  # the same key in two mappings is fine
