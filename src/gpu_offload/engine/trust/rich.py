"""Rich output from an untrusted cluster: a MIME allowlist, with HTML, SVG and Markdown sanitised.

Whoever runs a donor's pod can write any ``display_data`` frame, so what the kernel publishes from it must
not run script in the user's browser or make the browser load anything (a load leaks the user's address
and, for a relative URL, is a request to the Jupyter server with the user's cookies). Sanitising is done
by nh3 (Rust's ammonia) with an allowlist of tags and attributes; on top of it every URL-bearing attribute
must point inside the document (``#id``), be a link the user clicks (``http``, ``https``, ``mailto`` on
``<a>``), or an inline raster image (``data:image/...;base64``); ``style`` may not fetch (``url()`` other
than ``#id``, ``@import``, escapes). Markdown is parsed by a CommonMark parser (markdown-it-py), rendered
to HTML and cleaned the same way, then published as that HTML. Anything not on the list is dropped and named.
"""

from __future__ import annotations

import base64
import binascii
import functools
import html
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import nh3

from ...liqo_peering.untrusted_text import shown

ALLOWED_MIME = ("text/plain", "image/png", "image/jpeg", "application/json",
                "text/html", "image/svg+xml", "text/markdown")
MAX_MIME_BYTES = 64 << 20
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
_LINK = re.compile(r"(?:https?:|mailto:)", re.IGNORECASE)
_INLINE_IMAGE = re.compile(r"data:image/(?:png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]*\Z", re.IGNORECASE)
_CSS_FETCH = re.compile(r"url\s*\(\s*(?!['\"]?\s*#)|@import|expression\s*\(|\\|javascript:|image-set",
                        re.IGNORECASE)
_URL_ATTRS = {"href", "src", "xlink:href", "cite", "action", "formaction", "poster", "background"}

SVG_TAGS = {
    "svg", "g", "path", "rect", "circle", "ellipse", "line", "polyline", "polygon", "text", "tspan",
    "defs", "clippath", "mask", "pattern", "marker", "symbol", "use", "lineargradient", "radialgradient",
    "stop", "title", "desc", "image",
}
SVG_TAGS |= {"clipPath", "linearGradient", "radialGradient"}
_SVG_ATTRS = {
    "id", "class", "d", "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "ry", "width", "height",
    "points", "transform", "viewBox", "preserveAspectRatio", "fill", "fill-opacity", "fill-rule", "stroke",
    "stroke-width", "stroke-opacity", "stroke-linecap", "stroke-linejoin", "stroke-dasharray",
    "stroke-dashoffset", "stroke-miterlimit", "opacity", "style", "clip-path", "clip-rule", "mask",
    "font-family", "font-size", "font-weight", "font-style", "text-anchor", "dominant-baseline", "dx", "dy",
    "offset", "stop-color", "stop-opacity", "gradientUnits", "gradientTransform", "patternUnits",
    "markerWidth", "markerHeight", "refX", "refY", "orient", "href", "xmlns", "version", "visibility",
    "display", "marker-start", "marker-mid", "marker-end",
}
_SVG_ATTRS |= {name.lower() for name in _SVG_ATTRS}


@dataclass(frozen=True)
class SafeDisplay:
    """A display bundle fit to publish, and the MIME types left out of it."""

    data: dict[str, Any]
    metadata: dict[str, Any]
    dropped: tuple[str, ...]


def _attribute_filter(tag: str, attr: str, value: str) -> str | None:
    if attr in _URL_ATTRS:
        if value.startswith("#"):
            return value
        if tag in ("a", "area") and attr == "href" and _LINK.match(value):
            return value
        if tag in ("img", "image") and _INLINE_IMAGE.match(value):
            return value
        return None
    if attr == "style" or "url" in value.lower():
        return None if _CSS_FETCH.search(value) else value
    return value


def _cleaner(tags: set[str], attributes: dict[str, set[str]]) -> Callable[[str], str]:
    def clean(text: str) -> str:
        return nh3.clean(
            text, tags=tags, attributes=attributes, attribute_filter=_attribute_filter,
            url_schemes={"http", "https", "mailto", "data"}, strip_comments=True,
            clean_content_tags={"script", "style"}, link_rel="noopener noreferrer nofollow",
        )
    return clean


_HTML_ATTRIBUTES = {tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()}
_HTML_ATTRIBUTES.setdefault("table", set()).update({"border", "class"})
sanitize_html = _cleaner(set(nh3.ALLOWED_TAGS), _HTML_ATTRIBUTES)
"""HTML without script, event handlers, styles or loads (pandas tables keep their structure)."""
sanitize_svg = _cleaner(SVG_TAGS, {"*": _SVG_ATTRS})
"""SVG shapes and text without script, animation, foreign objects or loads."""

MAX_MARKDOWN_BYTES = 1 << 20
"""Longest Markdown rendered (the parser is pure Python: about a second per MiB here); longer is dropped."""


def _image_as_link(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """An image that would load a URL becomes a link to it (nothing loads until a click); an inline
    picture stays."""
    token = tokens[idx]
    src = str(token.attrGet("src") or "")
    if _INLINE_IMAGE.match(src):
        return str(renderer.image(tokens, idx, options, env))
    alt = renderer.renderInlineAsText(token.children or [], options, env) or "image"
    return f'<a href="{html.escape(src)}">[image: {html.escape(alt)}]</a>'


@functools.cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt

    # CommonMark with the tables and strikethrough notebooks use; raw HTML is parsed, then cleaned below
    parser = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    parser.add_render_rule("image", _image_as_link)
    return parser


def markdown_html(text: str) -> str:
    """Markdown rendered by a CommonMark parser, then cleaned as HTML is: links only to http(s), mailto or
    #fragments (the parser itself refuses ``javascript:`` and the like, in references too), every image that
    would load a URL a link instead, raw HTML without script, handlers or loads."""
    return sanitize_html(_markdown().render(text))


def _image(value: Any, mime: str) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        head = base64.b64decode(value[:64].strip() + "=" * (-len(value[:64].strip()) % 4))
    except (binascii.Error, ValueError):
        return None
    return value if head.startswith(_MAGIC[mime]) else None


def _json(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)  # already decoded from a bounded frame: only check it is JSON
    except (TypeError, ValueError, RecursionError):
        return None
    return value


def _text(clean: Callable[[str], str]) -> Callable[[Any], str | None]:
    def convert(value: Any) -> str | None:
        return clean(value) if isinstance(value, str) else None
    return convert


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "text/plain": lambda v: v if isinstance(v, str) else None,
    "image/png": lambda v: _image(v, "image/png"),
    "image/jpeg": lambda v: _image(v, "image/jpeg"),
    "application/json": _json,
    "text/html": _text(sanitize_html),
    "image/svg+xml": _text(sanitize_svg),
    "text/markdown": lambda v: markdown_html(v) if isinstance(v, str) and len(v) <= MAX_MARKDOWN_BYTES else None,
}
_PUBLISHED_AS = {"text/markdown": "text/html"}
"""Markdown is published as the HTML made of it: a frontend would parse Markdown again, its own way."""


def safe_display(data: Mapping[str, Any], metadata: Mapping[str, Any]) -> SafeDisplay:
    """Keep what is on the allowlist (sanitised); never raises. Metadata keeps only image sizes and the
    ``execute_result`` mark the engine uses."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for mime, value in data.items() if isinstance(data, Mapping) else ():
        convert = _CONVERT.get(mime)
        result = None
        if convert is not None and (not isinstance(value, str) or len(value) <= MAX_MIME_BYTES):
            try:
                result = convert(value)
            except BaseException as exc:  # noqa: BLE001 - nh3 raises a PanicException (a BaseException)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
        if result is None:
            dropped.append(shown(mime, 100))
        else:
            kept.setdefault(_PUBLISHED_AS.get(mime, mime), result)
    if not kept:
        kept["text/plain"] = "[output from an untrusted cluster dropped: " + ", ".join(dropped) + "]"
    return SafeDisplay(kept, _metadata(metadata, kept), tuple(dropped))


def _metadata(metadata: Mapping[str, Any], kept: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(metadata, Mapping):
        return {}
    out: dict[str, Any] = {}
    if metadata.get("execute_result") is True:
        out["execute_result"] = True
    for mime in ("image/png", "image/jpeg"):
        size = metadata.get(mime)
        if mime in kept and isinstance(size, Mapping):
            dims = {k: size[k] for k in ("width", "height") if type(size.get(k)) in (int, float)}
            if dims:
                out[mime] = dims
    return out
