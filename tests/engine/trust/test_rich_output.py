"""Rich output from an untrusted cluster: only allowlisted MIME types, and nothing that runs or loads."""

from __future__ import annotations

import base64
import io
import re

import pytest
from markdown_it import MarkdownIt

from gpu_offload.engine.trust.rich import safe_display, sanitize_html, sanitize_svg

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 40).decode()


def loads_or_runs(html: str) -> list[str]:
    """What in sanitised markup could run script or make the browser fetch something."""
    found = re.findall(r"<\s*(?:script|style|iframe|object|embed|foreignobject|animate|set|link|meta|base)\b",
                       html, re.I)
    found += re.findall(r"\son\w+\s*=", html, re.I)
    found += re.findall(r"javascript:", html, re.I)
    found += [m for m in re.findall(r"\b(?:src|href|action|data)\s*=\s*[\"']?([^\"'\s>]+)", html, re.I)
              if not m.startswith(("#", "data:image/png;base64", "https://example.org/doc"))]
    found += re.findall(r"url\(\s*['\"]?(?!#)", html, re.I)
    found += re.findall(r"style\s*=\s*[\"'][^\"']*\\", html, re.I)  # a CSS escape can spell url(
    return found


HOSTILE_HTML = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<img src='https://tracker.example/p.gif'>",
    "<img src='/files/private.csv'>",
    "<a href='javascript:alert(1)'>x</a>",
    "<a href='/api/contents' >relative</a>",
    "<div style=\"background:url('https://tracker.example/x')\">x</div>",
    "<div style=\"background:u\\72l(https://tracker.example/x)\">x</div>",
    "<svg><script>alert(1)</script></svg>",
    "<iframe src='https://evil.example'></iframe>",
    "<object data='x.swf'></object>",
    "<link rel=stylesheet href='https://evil.example/x.css'>",
    "<style>@import 'https://evil.example/x.css';</style>",
    "<math><mi xlink:href='javascript:alert(1)'>x</mi></math>",
    "<form action='https://evil.example'><input name=x></form>",
    "<body onload=alert(1)>",
    "<!--<img src=x onerror=alert(1)>-->",
    "<noscript><p title=\"</noscript><img src=x onerror=alert(1)>\">",
]


@pytest.mark.parametrize("markup", HOSTILE_HTML)
def test_html_neither_runs_nor_loads_anything(markup: str) -> None:
    assert loads_or_runs(sanitize_html(markup)) == []


def test_html_keeps_tables_links_and_inline_pictures() -> None:
    table = '<table border="1" class="dataframe"><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>'
    clean = sanitize_html(table + f'<a href="https://example.org/doc">doc</a><img src="data:image/png;base64,{PNG}">')
    assert table in clean
    assert 'href="https://example.org/doc"' in clean and "noopener" in clean
    assert f'src="data:image/png;base64,{PNG}"' in clean


HOSTILE_SVG = [
    '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><rect width="5" height="5"/></svg>',
    '<svg><a href="javascript:alert(1)"><text>x</text></a></svg>',
    '<svg><animate attributeName="href" to="javascript:alert(1)"/></svg>',
    '<svg><set attributeName="onmouseover" to="alert(1)"/></svg>',
    '<svg><foreignObject><iframe src="https://evil.example"></iframe></foreignObject></svg>',
    '<svg><image href="https://tracker.example/x.png"/></svg>',
    '<svg><use href="https://evil.example/sprite.svg#x"/></svg>',
    '<svg><rect fill="url(https://evil.example/x#p)" width="1" height="1"/></svg>',
    '<svg><style>rect{fill:url(https://evil.example/x)}</style></svg>',
]


@pytest.mark.parametrize("markup", HOSTILE_SVG)
def test_svg_neither_runs_nor_loads_anything(markup: str) -> None:
    assert loads_or_runs(sanitize_svg(markup)) == []


@pytest.mark.e2e  # starts a process
def test_a_matplotlib_svg_keeps_its_drawing() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 3, 2])
    ax.set_title("loss")
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    clean = sanitize_svg(out.getvalue())
    assert loads_or_runs(clean) == []
    assert 'viewBox="0 0 144 144"' in clean
    assert clean.count("<path") == out.getvalue().count("<path")  # every stroke is still drawn
    assert clean.count("<use") == out.getvalue().count("<use") and 'href="#' in clean  # glyphs, ticks


def shown_in_browser(markdown: str) -> str:
    """The HTML a notebook frontend makes of the Markdown a donor sent, as the kernel publishes it (Markdown
    published as such is rendered by the frontend: CommonMark with raw HTML and any link destination)."""
    shown = safe_display({"text/markdown": markdown}, {}).data
    if "text/markdown" in shown:
        frontend = MarkdownIt("commonmark", {"html": True})
        frontend.validateLink = lambda url: True  # marked (JupyterLab's) keeps every destination
        return frontend.render(shown["text/markdown"])
    return str(shown["text/html"])


def loads(html: str) -> list[str]:
    """Images that load a URL and links that run script in ``html``."""
    found = [src for src in re.findall(r"<img[^>]*\ssrc=\"([^\"]*)\"", html) if not src.startswith("data:image/")]
    return found + re.findall(r"href=\"\s*(?:javascript|vbscript|data):[^\"]*\"", html, re.I)


@pytest.mark.parametrize("markdown", [
    "![![pixel](data:image/png;base64,iVBORw0KGgo=)](https://tracker.example/p.png)",  # an image in an image
    "![a\\](data:image/png;base64,iVBORw0KGgo=) ](https://tracker.example/p.png)",  # an escaped bracket
    "[x][r]\n\n[r]:\n  javascript:alert(document.cookie)",  # a definition's destination on its next line
    "[x][r]\n\n> [r]: javascript:alert(document.cookie)",  # a definition inside a quote
    "[x][r]\n\n- [r]: javascript:alert(document.cookie)",  # ... or a list item
])
def test_markdown_crafted_around_a_pattern_neither_loads_nor_runs(markdown: str) -> None:
    html = shown_in_browser(markdown)
    assert loads(html) == [], f"the browser would load or run: {loads(html)} in {html!r}"


def test_markdown_becomes_clean_readable_html() -> None:
    text = ("# Result\n\n> quoted\n\n![plot](https://tracker.example/p.png) and ![ref][r] "
            f"and ![inline](data:image/png;base64,{PNG})\n\n[r]: https://tracker.example/q.png\n\n"
            "<script>alert(1)</script>\n\nsee <img src=x onerror=alert(1)> **bold** \\![not an image](#x)\n\n"
            "| a | b |\n|---|---|\n| 1 | 2 |\n\n`x < y & z` ~~old~~\n")
    html = shown_in_browser(text)
    assert loads(html) == [] and "<script" not in html and "onerror" not in html
    assert '<a href="https://tracker.example/p.png" rel="noopener noreferrer nofollow">[image: plot]</a>' in html
    assert '<a href="https://tracker.example/q.png" rel="noopener noreferrer nofollow">[image: ref]</a>' in html
    assert f'<img src="data:image/png;base64,{PNG}" alt="inline">' in html
    assert '!<a href="#x" rel="noopener noreferrer nofollow">not an image</a>' in html
    assert "<h1>Result</h1>" in html and "<blockquote>" in html and "<strong>bold</strong>" in html
    assert "<td>1</td>" in html and "<code>x &lt; y &amp; z</code>" in html and "<s>old</s>" in html


def test_markdown_is_published_as_its_html_beside_the_text() -> None:
    shown = safe_display({"text/markdown": "*it*", "text/plain": "<Markdown>"}, {})
    assert shown.data == {"text/html": "<p><em>it</em></p>\n", "text/plain": "<Markdown>"} and shown.dropped == ()


def test_only_allowlisted_mime_types_are_published() -> None:
    shown = safe_display(
        {"text/plain": "x", "image/png": PNG, "image/jpeg": JPEG, "application/json": {"a": [1]},
         "text/html": "<b onclick='x()'>b</b>", "application/javascript": "alert(1)",
         "application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/latex": "$x$"},
        {"image/png": {"width": 10, "height": "evil"}, "execute_result": True, "isolated": False},
    )
    assert shown.data == {"text/plain": "x", "image/png": PNG, "image/jpeg": JPEG,
                          "application/json": {"a": [1]}, "text/html": "<b>b</b>"}
    assert shown.dropped == ("application/javascript", "application/vnd.jupyter.widget-view+json", "text/latex")
    assert shown.metadata == {"execute_result": True, "image/png": {"width": 10}}


def test_a_mime_value_that_is_not_what_it_claims_is_dropped() -> None:
    shown = safe_display({"image/png": base64.b64encode(b"<svg onload=alert(1)>").decode(),
                          "text/html": {"not": "text"}, "text/plain": 5}, {})
    assert shown.dropped == ("image/png", "text/html", "text/plain")
    assert shown.data == {"text/plain": "[output from an untrusted cluster dropped: image/png, text/html, text/plain]"}


@pytest.mark.parametrize("markdown", [
    "[x](javascript:alert(1))", "[x](JaVaScript&#58;alert(1))", "[x](<javascript:alert(1)>)",
    "[x][r]\n\n[r]: javascript:alert(1)", "[x](vbscript:msgbox)", "[x](java\\script:alert(1))",
])
def test_markdown_links_never_lead_to_script(markdown: str) -> None:
    html = shown_in_browser(markdown)
    assert loads(html) == [] and "script:" not in html.lower().replace("&#58;", ":").split("</a>")[0].split(">")[0]


def test_markdown_links_to_the_web_stay() -> None:
    html = shown_in_browser("[doc](https://example.org/doc) [mail](mailto:a@b.c) [top](#top)")
    for href in ("https://example.org/doc", "mailto:a@b.c", "#top"):
        assert f'<a href="{href}" rel="noopener noreferrer nofollow">' in html


def test_a_mime_type_the_donor_forged_is_named_on_one_printable_line() -> None:
    shown = safe_display({"text/evil\x1b[2J\r\nforged " + "m" * 200: "x"}, {})
    assert shown.dropped == ("text/evil [2J forged " + "m" * 79 + "...",)
    assert all(c.isprintable() for c in shown.data["text/plain"])
