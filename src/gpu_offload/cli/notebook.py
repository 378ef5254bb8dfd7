"""Executes a notebook headless for ``gpu-offload quickstart``, streaming.

The cells' output (the magic's own lines included, such as where a cell's pod runs) is printed as the
kernel publishes it, not when the notebook ends, and the executed notebook is written next to the source
(or to ``output``). Which backend the cells use is the kernel environment's business (``env``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NOTEBOOK = "quickstart.ipynb"


def default_notebook() -> Path:
    """``examples/quickstart.ipynb`` of the working directory, else of the source tree we run from."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = root / "examples" / NOTEBOOK
        if candidate.is_file():
            return candidate
    return Path("examples") / NOTEBOOK


def execute(source: Path, output: Path | None = None, timeout: int = 600,
            env: Mapping[str, str] | None = None) -> int:
    """Execute ``source`` in a fresh ``python3`` kernel (with ``env``, else this process's environment),
    printing output as it arrives; 0 when every cell ran, 1 on a cell error, 2 when it is missing."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    if not source.is_file():
        print(
            f"gpu-offload quickstart: notebook {source} not found. Run it from the repository root, or "
            "pass --notebook PATH.",
            file=sys.stderr,
        )
        return 2
    output = output or source.with_name(source.stem + ".executed.ipynb")
    notebook = nbformat.read(source, as_version=4)
    client = _streaming_client(notebook, source.parent, timeout)
    status = 0
    try:
        client.execute(**({"env": dict(env)} if env is not None else {}))
    except CellExecutionError as err:
        print(f"\ngpu-offload quickstart: a cell failed, stopping:\n{err}", file=sys.stderr)
        status = 1
    finally:
        output.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, output)
    print(f"\nwrote {output}")
    return status


def _streaming_client(notebook: Any, cwd: Path, timeout: int) -> Any:
    from nbclient import NotebookClient

    echo = Echo()

    class StreamingClient(NotebookClient):  # type: ignore[misc]
        """Prints each cell's output the moment its iopub message arrives."""

        def process_message(self, msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
            # nbclient writes an update into the notebook's output without calling ``output``: echo it here
            if msg["msg_type"] == "update_display_data":
                echo(msg)
            return super().process_message(msg, cell, cell_index)

        def output(self, outs: Any, msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
            echo(msg)
            return super().output(outs, msg, display_id, cell_index)

    def header(cell: Any, cell_index: int) -> None:
        if cell.cell_type == "code":
            first = cell.source.splitlines()[0] if cell.source else ""
            print(f"\n[cell {cell_index}] {first}", flush=True)

    return StreamingClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
        on_cell_execute=header,
    )


_NUMBER = re.compile(r"\d+(\.\d+)?")


class Echo:
    """Prints iopub messages as text as they arrive. A display updated in place (the magic's notices under a
    cell: a line added, the wait's progress line replaced) prints only the lines its updates add; a line that
    differs from one already printed only in its numbers (``waiting 12 s`` after ``waiting 9 s``) is the same
    clock ticking and is not printed again, so the terminal gets every new sentence once."""

    def __init__(self) -> None:
        self._shown: dict[str, set[str]] = {}
        """Display id -> its lines printed so far, numbers masked."""

    def __call__(self, msg: dict[str, Any]) -> None:
        kind = msg["msg_type"]
        content = msg["content"]
        if kind == "stream":
            target = sys.stderr if content.get("name") == "stderr" else sys.stdout
            target.write(content.get("text", ""))
            target.flush()
        elif kind in ("display_data", "execute_result", "update_display_data"):
            self._display(kind, content)
        elif kind == "error":
            print(f"{content.get('ename')}: {content.get('evalue')}", file=sys.stderr, flush=True)

    def _display(self, kind: str, content: dict[str, Any]) -> None:
        data = content.get("data", {})
        rich = sorted(mime for mime in data if mime != "text/plain")
        text = data.get("text/plain", "")
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id and not rich:
            shown = self._shown.setdefault(str(display_id), set())
            lines = text.splitlines()
            if kind == "update_display_data":
                lines = [line for line in lines if _NUMBER.sub("#", line) not in shown]
            shown.update(_NUMBER.sub("#", line) for line in lines)
            if kind == "update_display_data" and not lines:
                return
            text = "\n".join(lines)
        print(f"{text}{'  ' if text and rich else ''}{'[' + ', '.join(rich) + ']' if rich else ''}", flush=True)
