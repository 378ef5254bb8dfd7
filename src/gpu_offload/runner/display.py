"""``display()`` for offloaded cells, without IPython: MIME bundles for the common types.

The same shim is used whether or not IPython is installed where the cell runs, so a cell behaves the same
on every image. Matplotlib figures are rendered as PNG (through the runner's own backend, see
:mod:`.mpl_backend`), like Jupyter's inline backend.
"""

from __future__ import annotations

import base64
import io
import sys
from collections.abc import Callable
from typing import Any

Emit = Callable[..., None]

_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
)

_emit: Emit | None = None


def set_emitter(emit: Emit | None) -> None:
    """Where ``display_data`` events go (the runner's frame encoder)."""
    global _emit
    _emit = emit


def display(*objs: Any, raw: bool = False, metadata: dict[str, Any] | None = None, **_: Any) -> None:
    """Show each object under the cell, as rich as it can be shown (HTML, PNG, ... and plain text)."""
    for obj in objs:
        meta: dict[str, Any] = {}
        if raw:
            data = dict(obj)
        else:
            data, meta = mime_bundle(obj)
        _send(data, {**meta, **(metadata or {})})


# A cell's `from IPython.display import display` binds this function, and the name returns to the kernel as an
# output: pickled by reference to IPython's own display (the hook and the shim put it there), which the kernel
# has, rather than to this runner's module, which it has not.
display.__module__ = "IPython.display"


def _send(data: dict[str, Any], metadata: dict[str, Any]) -> None:
    if _emit is None:  # used outside a runner: fall back to text
        print(data.get("text/plain", ""))
        return
    _emit("display_data", data=data, metadata=metadata)


def mime_bundle(obj: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MIME bundle (text for text types, base64 for binary) and metadata for ``obj``."""
    data: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    if _is_figure(obj):
        data["image/png"] = _figure_png(obj)
    bundle_method = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle_method) and not isinstance(obj, type):
        result = _call(bundle_method)
        if isinstance(result, tuple) and len(result) == 2:
            result, extra = result
            meta.update(extra or {})
        if isinstance(result, dict):
            data.update({mime: _textual(value) for mime, value in result.items()})
    for mime, name in _REPR_METHODS:
        method = getattr(obj, name, None)
        if mime in data or not callable(method) or isinstance(obj, type):
            continue
        result = _call(method)
        if isinstance(result, tuple) and len(result) == 2:
            result, extra = result
            if extra:
                meta[mime] = extra
        if result is not None:
            data[mime] = _textual(result)
    if "text/plain" not in data:
        data["text/plain"] = _plain(obj)
    return data, meta


def _call(method: Callable[[], Any]) -> Any:
    # a broken _repr_*_ must not lose the output: the plain repr still shows
    try:
        return method()
    except Exception:
        return None


def _textual(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    return value


def _plain(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception as exc:
        return f"<{type(obj).__name__} object: repr failed with {type(exc).__name__}: {exc}>"


def _is_figure(obj: Any) -> bool:
    return type(obj).__module__.startswith("matplotlib.") and callable(getattr(obj, "savefig", None))


def _figure_png(figure: Any) -> str:
    out = io.BytesIO()
    figure.savefig(out, format="png", bbox_inches="tight")
    return base64.b64encode(out.getvalue()).decode("ascii")


def show_open_figures() -> None:
    """Display every open pyplot figure as PNG and close it (``plt.show()`` and the end of a cell)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        display(pyplot.figure(number))
    pyplot.close("all")
