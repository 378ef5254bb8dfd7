"""Writes the generated references in docs/: each chart's values (from its values.schema.json and values.yaml),
the ``gpu-offload`` command's (from its parsers), and the tables of environment variables inside hand-written
pages (from their definitions in ``liqo_peering/environment.py``).

    python docs/generate.py          # rewrite them
    python docs/generate.py --check  # exit 1 naming the files that are out of date (the tests do the same)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHARTS = {
    "chart-values.md": ("helm/gpu-offload", "The origin's chart (`helm/gpu-offload`)",
                        "Besides these, the chart passes its `jupyterhub:` key to zero-to-jupyterhub: its own "
                        "configuration reference applies there."),
    "donor-chart-values.md": ("helm/gpu-offload-donor", "The donor's chart (`helm/gpu-offload-donor`)", ""),
}
SKIPPED = {"global", "jupyterhub"}
SETTINGS_TABLES = {
    "kubernetes.md": ("KERNEL", "environment variable"),
    "hub.md": ("HUB", "environment variable"),
    "metaflow.md": ("FLOW", "setting (environment variable or the same key in Metaflow's config file)"),
}
"""Page: (group of ``liqo_peering.environment``, the first column's title), for each table of variables."""
NOTE = "<!-- generated from liqo_peering/environment.py by python docs/generate.py: edit the definitions -->"


def _resolved(node: Mapping[str, Any], definitions: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    return {**definitions[ref.rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}


def _type(node: Mapping[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kinds = node.get("type") or [t.get("type", "?") for t in node.get("anyOf", [])]
    return " or ".join(dict.fromkeys(kinds)) if isinstance(kinds, list) else str(kinds)


def leaves(schema: Mapping[str, Any], defaults: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str, Any, str]]:
    """(dotted key, type, default, description) of every value the schema describes, in its order."""
    definitions = schema.get("definitions", {})

    def walk(node: Mapping[str, Any], value: Any, where: tuple[str, ...]) -> Iterator[tuple[str, str, Any, str]]:
        node = _resolved(node, definitions)
        properties = node.get("properties")
        if properties and node.get("type") == "object" and not node.get("description"):
            for key, child in properties.items():
                if not where and key in SKIPPED:
                    continue
                yield from walk(child, value.get(key) if isinstance(value, Mapping) else None, (*where, key))
            return
        yield ".".join(where), _type(node), value, str(node.get("description", ""))

    yield from walk(schema, defaults, path)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def values_reference(chart: str, title: str, note: str) -> str:
    """The Markdown reference of one chart's values."""
    folder = REPO / chart
    schema = json.loads((folder / "values.schema.json").read_text())
    defaults = yaml.safe_load((folder / "values.yaml").read_text())
    lines = [f"# {title}: values", "",
             f"Generated from `{chart}/values.schema.json` and `{chart}/values.yaml` by `python docs/generate.py`;",
             "edit those, not this file. values.yaml's comments say more about each value.", ""]
    if note:
        lines += [note, ""]
    lines += ["| value | type | default | what it is |", "|---|---|---|---|"]
    for key, kind, default, description in leaves(schema, defaults):
        shown = json.dumps(default) if default not in (None, "", [], {}) else ("`null`" if default is None else
                                                                               f"`{json.dumps(default)}`")
        if not shown.startswith("`"):
            shown = f"`{shown}`"
        lines.append(f"| `{key}` | {kind} | {_cell(shown)} | {_cell(description)} |")
    return "\n".join(lines) + "\n"


def _helps(parser: argparse.ArgumentParser, title: str) -> Iterator[tuple[str, str]]:
    """(title, help text) of ``parser`` and of each of its own sub-commands."""
    yield title, parser.format_help()
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, f"{title} {name}")


def cli_reference() -> str:
    """The Markdown reference of ``gpu-offload``: every sub-command's help, as ``--help`` prints it."""
    import os

    from gpu_offload import cli

    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: one width for everyone
    try:
        top = cli.build_parser([])
        sections = [("gpu-offload", top.format_help())]
        for command in cli.COMMANDS:
            parser = cli.build_parser([command.name])
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command.name]
            sections.extend(_helps(sub, f"gpu-offload {command.name}"))
    finally:
        if width is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = width
    lines = ["# The `gpu-offload` command", "",
             "Generated from the command's parsers by `python docs/generate.py`; edit the parsers, not this file.", ""]
    for title, text in sections:
        lines += [f"## {title}", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def settings_table(group: str, title: str) -> list[str]:
    """The Markdown table of the variables of ``group`` (``KERNEL``, ``HUB``, ``FLOW``): name, default, meaning."""
    from gpu_offload.liqo_peering import environment

    rows = [f"| `{s.name}` | {s.documented_default} | {s.doc} |" for s in getattr(environment, group)]
    return [NOTE, f"| {title} | default | meaning |", "|---|---|---|", *rows]


def with_settings_table(page: Path, group: str, title: str) -> str:
    """``page`` as written, but for its table of variables, which is generated."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title} |"))
    end = start
    start -= lines[start - 1] == NOTE
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *settings_table(group, title), *lines[end:]]) + "\n"


def generated() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    files = {REPO / "docs" / name: values_reference(*spec) for name, spec in CHARTS.items()}
    files[REPO / "docs" / "cli.md"] = cli_reference()
    for name, (group, title) in SETTINGS_TABLES.items():
        files[REPO / "docs" / name] = with_settings_table(REPO / "docs" / name, group, title)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which generated files are out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in generated().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run python docs/generate.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(generated()[path])
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
