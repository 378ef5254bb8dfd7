"""The generated references in docs/ are current, and complete: every chart value has a description."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generate", REPO / "docs" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_reference_is_current(generate: ModuleType) -> None:
    stale = [str(p.relative_to(REPO)) for p, text in generate.generated().items()
             if not p.exists() or p.read_text() != text]
    assert stale == [], f"out of date: {stale}; run python docs/generate.py"


@pytest.mark.parametrize("chart", ["helm/gpu-offload", "helm/gpu-offload-donor"])
def test_every_chart_value_is_described_and_every_default_is_listed(generate: ModuleType, chart: str) -> None:
    schema = json.loads((REPO / chart / "values.schema.json").read_text())
    defaults = yaml.safe_load((REPO / chart / "values.yaml").read_text())
    rows = list(generate.leaves(schema, defaults))
    assert [key for key, _, _, description in rows if not description] == []
    # every top-level value of values.yaml has rows (nothing the schema forgot to describe)
    listed = {key.split(".")[0] for key, *_ in rows}
    assert set(defaults) - generate.SKIPPED <= listed
