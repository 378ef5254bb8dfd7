"""Executes a notebook headless for ``gpu-offload quickstart``, streaming.

The cells' output (the magic's own lines included, such as where a cell's pod runs) is printed as the
kernel publishes it, not when the notebook ends, and the executed notebook is written next to the source
(or to ``output``). Which backend the cells use is the kernel environment's business (``env``).
"""

from __future__ import annotations

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

    class StreamingClient(NotebookClient):  # type: ignore[misc]
        """Prints each cell's output the moment its iopub message arrives."""

        def output(self, outs: Any, msg: dict[str, Any], display_id: Any, cell_index: int) -> Any:
            _echo(msg)
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


def _echo(msg: dict[str, Any]) -> None:
    kind = msg["msg_type"]
    content = msg["content"]
    if kind == "stream":
        target = sys.stderr if content.get("name") == "stderr" else sys.stdout
        target.write(content.get("text", ""))
        target.flush()
    elif kind in ("display_data", "execute_result", "update_display_data"):
        data = content.get("data", {})
        rich = sorted(mime for mime in data if mime != "text/plain")
        text = data.get("text/plain", "")
        print(
            f"{text}{'  ' if text and rich else ''}{'[' + ', '.join(rich) + ']' if rich else ''}", flush=True
        )
    elif kind == "error":
        print(f"{content.get('ename')}: {content.get('evalue')}", file=sys.stderr, flush=True)
