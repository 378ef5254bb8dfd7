"""``from IPython.display import display, HTML, Markdown, Image`` on an image without IPython.

A notebook cell written for Jupyter imports IPython's display helpers; a stock image (``python:3.11-slim``,
most PyTorch images) has no IPython, so the cell would fail on its first line. Where IPython is missing,
:func:`install` answers the imports of ``IPython``, ``IPython.display``, ``IPython.core`` and
``IPython.core.display`` with these small classes. They keep IPython's attribute names, reprs and MIME
bundles (IPython 9's ``IPython.core.display``), so the notebook shows the same outputs as with IPython, and
a value the cell returns unpickles in the kernel as IPython's own class. Where IPython is installed it is
used (:mod:`.ipython_hook` makes its ``display`` the runner's); this finder sits last on the meta path and
is asked only when no other finder knows the module.
"""

from __future__ import annotations

import base64
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .display import display

ANSWERED = ("IPython", "IPython.display", "IPython.core", "IPython.core.display")
_PACKAGES = ("IPython", "IPython.core")
_IMAGE_MAGICS = (("png", (b"\x89PNG\r\n\x1a\n",)), ("jpeg", (b"\xff\xd8",)), ("gif", (b"GIF87a", b"GIF89a")),
                 ("webp", (b"RIFF",)))
_IMAGE_FORMATS = {"png", "jpeg", "gif", "webp"}


def get_ipython() -> None:
    """No IPython shell runs here (code that checks for one, as tqdm does, takes its plain path)."""
    return None


get_ipython.__module__ = "IPython"  # as display (see .display): the kernel unpickles IPython's own


def _exists(path: str) -> bool:
    try:
        return os.path.exists(path)
    except (ValueError, OSError):  # a long or NUL-holding string is data, not a path
        return False


def _deep_copy(metadata: Any) -> Any:
    import copy  # not at the top: only a display object with metadata needs it, never a cold start

    return copy.deepcopy(metadata)


class DisplayObject:
    """Data shown as one MIME type; from ``data``, a ``filename`` or a ``url`` (read at creation, as IPython)."""

    _read_flags = "r"
    metadata: dict[str, Any] | None = None

    def __init__(self, data: Any = None, url: str | None = None, filename: str | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        if isinstance(data, os.PathLike):
            data = os.fspath(data)
        if isinstance(data, str) and url is None and data.startswith("http"):
            url, filename, data = data, None, None
        elif isinstance(data, str) and filename is None and _exists(data):
            url, filename, data = None, data, None
        self.url = url
        self.filename = filename
        self.data = data
        self.metadata = metadata if metadata is not None else (self.metadata or {})
        self.reload()
        self._check_data()

    def __repr__(self) -> str:
        return f"<IPython.core.display.{type(self).__name__} object>"

    def _check_data(self) -> None:
        pass

    def _data_and_metadata(self) -> Any:
        return (self.data, _deep_copy(self.metadata)) if self.metadata else self.data

    def reload(self) -> None:
        """Read the data from the file or URL it came from."""
        if self.filename is not None:
            binary = "b" in self._read_flags
            with open(self.filename, self._read_flags, encoding=None if binary else "utf-8") as handle:
                self.data = handle.read()
        elif self.url is not None:
            from urllib.request import urlopen

            with urlopen(self.url) as response:  # noqa: S310 - the cell asked for this URL
                raw = response.read()
                charset = response.headers.get_content_charset()
            self.data = raw.decode(charset, "replace") if charset else raw


class TextDisplayObject(DisplayObject):
    """Text data (HTML, Markdown, LaTeX, ...)."""

    def _check_data(self) -> None:
        if self.data is not None and not isinstance(self.data, str):
            raise TypeError(f"{type(self).__name__} expects text, not {self.data!r}")


class Pretty(TextDisplayObject):
    """Plain text shown as it is."""

    def __repr__(self) -> str:
        return str(self.data)


class HTML(TextDisplayObject):
    """HTML, shown rendered."""

    def _repr_html_(self) -> Any:
        return self._data_and_metadata()

    def __html__(self) -> Any:
        return self._repr_html_()


class Markdown(TextDisplayObject):
    """Markdown, shown rendered."""

    def _repr_markdown_(self) -> Any:
        return self._data_and_metadata()


class Latex(TextDisplayObject):
    """LaTeX, shown rendered."""

    def _repr_latex_(self) -> Any:
        return self._data_and_metadata()


class Math(TextDisplayObject):
    """A formula, shown in display style."""

    def _repr_latex_(self) -> Any:
        text = rf"$\displaystyle {self.data.strip('$')}$"
        return (text, _deep_copy(self.metadata)) if self.metadata else text


class SVG(DisplayObject):
    """An SVG drawing (the ``<svg>`` element of the document)."""

    _read_flags = "rb"
    _data: str | None = None

    @property  # type: ignore[override]
    def data(self) -> str | None:
        return self._data

    @data.setter
    def data(self, svg: Any) -> None:
        if svg is None:
            self._data = None
            return
        from xml.dom import minidom

        found = minidom.parseString(svg).getElementsByTagName("svg")
        if found:
            svg = found[0].toxml()
        self._data = svg.decode(errors="replace") if isinstance(svg, bytes) else svg

    def _repr_svg_(self) -> Any:
        return self._data_and_metadata()


class JSON(DisplayObject):
    """A JSON-able value, shown as a collapsible tree."""

    def __init__(self, data: Any = None, url: str | None = None, filename: str | None = None,
                 expanded: bool = False, metadata: dict[str, Any] | None = None, root: str = "root",
                 **kwargs: Any) -> None:
        self.metadata = {"expanded": expanded, "root": root, **(metadata or {}), **kwargs}
        super().__init__(data=data, url=url, filename=filename)

    def _data_and_metadata(self) -> Any:
        return self.data, self.metadata

    def _repr_json_(self) -> Any:
        return self._data_and_metadata()

    def reload(self) -> None:
        super().reload()
        if isinstance(self.data, (str, bytes)) and (self.filename or self.url):
            import json

            self.data = json.loads(self.data)


class Image(DisplayObject):
    """A PNG, JPEG, GIF or WEBP image: embedded, or (``url=`` without ``embed``) an ``<img>`` tag."""

    _read_flags = "rb"

    def __init__(self, data: Any = None, url: str | None = None, filename: str | None = None,
                 format: str | None = None, embed: bool | None = None, width: int | None = None,  # noqa: A002
                 height: int | None = None, unconfined: bool = False, metadata: dict[str, Any] | None = None,
                 alt: str | None = None) -> None:
        if isinstance(data, os.PathLike):
            data = os.fspath(data)
        source = filename or url or (data if isinstance(data, str) and (data.startswith("http") or _exists(data))
                                     else None)
        if source is None and data is None:
            raise ValueError("No image data found. Expecting filename, url, or data.")
        if format is None:
            format = _extension(source) if source is not None else _sniff(data)  # noqa: A001
        format = format.lower()  # noqa: A001
        self.format = "jpeg" if format == "jpg" else format
        self.embed = embed if embed is not None else url is None
        if self.embed:
            if self.format not in _IMAGE_FORMATS:
                raise ValueError(f"Cannot embed the '{self.format}' image format")
            self._mimetype = f"image/{self.format}"
        self.width, self.height, self.retina, self.unconfined, self.alt = width, height, False, unconfined, alt
        super().__init__(data=data, url=url, filename=filename, metadata=metadata)
        for name in ("width", "height", "alt"):
            if getattr(self, name) is None and self.metadata and self.metadata.get(name):
                setattr(self, name, self.metadata[name])

    def reload(self) -> None:
        if self.embed:
            super().reload()

    def _repr_html_(self) -> str | None:
        if self.embed:
            return None
        import html

        attributes = "".join(f' {name}="{int(value)}"' for name, value in (("width", self.width),
                                                                         ("height", self.height)) if value)
        if self.unconfined:
            attributes += ' class="unconfined"'
        if self.alt:
            attributes += f' alt="{html.escape(self.alt)}"'
        return f'<img src="{html.escape(self.url or self.filename or "")}"{attributes}/>'

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        if not self.embed:
            return {"text/html": self._repr_html_()}
        data, metadata = self._data_and_metadata(always_both=True)
        return {self._mimetype: data}, ({self._mimetype: metadata} if metadata else metadata)

    def _data_and_metadata(self, always_both: bool = False) -> Any:
        if not isinstance(self.data, (bytes, bytearray)):
            raise FileNotFoundError(f"No such file or directory: '{self.data}'")
        encoded = base64.b64encode(self.data).decode("ascii")
        metadata = dict(self.metadata or {})
        for name in ("width", "height", "unconfined", "alt"):
            if getattr(self, name):
                metadata[name] = getattr(self, name)
        return (encoded, metadata) if metadata or always_both else encoded

    def _repr_png_(self) -> Any:
        return self._data_and_metadata() if self.embed and self.format == "png" else None

    def _repr_jpeg_(self) -> Any:
        return self._data_and_metadata() if self.embed and self.format == "jpeg" else None


def _extension(source: str) -> str:
    base, extension = os.path.splitext(source)
    return extension[1:].lower() if extension else base


def _sniff(data: Any) -> str:
    if isinstance(data, bytes):
        for name, magics in _IMAGE_MAGICS:
            if data.startswith(magics) and (name != "webp" or data[8:12] == b"WEBP"):
                return name
    return "png"  # IPython's default too


_EXPORTS = {"display": display, "get_ipython": get_ipython, "DisplayObject": DisplayObject,
            "TextDisplayObject": TextDisplayObject, "Pretty": Pretty, "HTML": HTML, "Markdown": Markdown,
            "Latex": Latex, "Math": Math, "SVG": SVG, "JSON": JSON, "Image": Image}
for _cls in _EXPORTS.values():
    if isinstance(_cls, type):  # pickled by reference (this module is imported whenever the class is used):
        _cls.__module__ = "IPython.display"  # the kernel loads IPython's own class of that name


class _Finder:  # last on the meta path: asked only for modules no other finder found
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in ANSWERED:
            return None
        if fullname != "IPython" and not getattr(sys.modules.get("IPython"), "_gpu_offload_shim", False):
            return None  # a real IPython without that module: not ours to answer
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname in _PACKAGES)  # type: ignore[arg-type]


class _Loader:
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ == "IPython":
            module._gpu_offload_shim = True  # type: ignore[attr-defined]
            module.display = display  # type: ignore[attr-defined]
            module.get_ipython = get_ipython  # type: ignore[attr-defined]
        elif module.__name__ in ("IPython.display", "IPython.core.display"):
            module.__dict__.update(_EXPORTS)
            module.__all__ = sorted(_EXPORTS)  # type: ignore[attr-defined]


def install() -> None:
    """Answer the IPython imports above wherever IPython itself is not installed."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
