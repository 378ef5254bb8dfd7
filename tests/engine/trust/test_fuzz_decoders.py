"""Every decoder of a donor's bytes on malformed input: seeded, time-boxed, each decode in a child process.

For each family (npy, Arrow, torch weights, the safe container, the frame reader, HTML, SVG and Markdown
sanitising) valid seeds are mutated (``fuzz_inputs.py``) and decoded one by one in ``decode_child.py``. A
case fails when the child dies (a crash of the kernel it would have run in), when anything but the
decoder's own refusal escapes, when sanitised markup could load or run something, or when a decode breaks
the stated bounds: at most ``TIME_FIXED + TIME_PER_BYTE`` per input byte of wall time, and at most
``EXPANSION`` times the input plus ``EXPANSION_SLACK`` of peak memory growth.

The lane: marker ``fuzz``, run by CI as its own stage (tests/run.sh). ``GPU_OFFLOAD_FUZZ_SECONDS`` (default
12) is each family's time box; ``GPU_OFFLOAD_FUZZ_SEED`` (default 20) the seed. A failure names the seed
and the case index and writes the input under the test's tmp_path.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from .fuzz_inputs import DECODER, WRAP, mutate, seeds
from .isolated import DecodeChild

pytestmark = pytest.mark.fuzz

SECONDS = float(os.environ.get("GPU_OFFLOAD_FUZZ_SECONDS", "12"))
SEED = int(os.environ.get("GPU_OFFLOAD_FUZZ_SEED", "20"))
MAX_CASES = 20000
TIME_FIXED, TIME_PER_BYTE = 2.0, 2e-6
"""Wall time a decode may take: 2 s, plus 2 s per MiB (a decode is linear; the slack is for a shared CPU)."""
EXPANSION, EXPANSION_SLACK = 32, 16 << 20
"""Peak memory a decode may add: 32 bytes per input byte, plus 16 MiB (docs/security.md)."""
SEEDS = seeds()


@pytest.fixture(scope="module")
def decode_child() -> Iterator[DecodeChild]:
    with DecodeChild() as process:
        yield process


_BANNED = {"script", "style", "iframe", "object", "embed", "foreignobject", "animate", "set", "link", "meta", "base"}
_URL_ATTRS = {"href", "xlink:href", "src", "action", "formaction", "data", "poster", "background", "cite"}


class _Markup(HTMLParser):
    """What a browser would act on in markup: tags, and attributes as the browser reads them (unescaped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BANNED:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = value or ""
            if name.startswith("on"):
                self.found.append(f"<{tag} {name}>")
            elif name in _URL_ATTRS and not _allowed_url(tag, value.strip()):
                self.found.append(f"<{tag} {name}={value[:80]!r}>")
            elif name == "style" and re.search(r"url\s*\(\s*['\"]?(?!#)|@import|\\", value, re.I):
                self.found.append(f"<{tag} style={value[:80]!r}>")

    handle_startendtag = handle_starttag


def _allowed_url(tag: str, url: str) -> bool:
    if url.startswith("#"):
        return True
    if tag in ("a", "area"):
        return re.match(r"(?:https?:|mailto:)", url, re.I) is not None
    return tag in ("img", "image") and re.match(r"data:image/(?:png|jpeg|gif|webp);base64,", url, re.I) is not None


def unsafe_markup(html: str) -> list[str]:
    """What in published markup could run script or make the browser fetch something."""
    parser = _Markup()
    parser.feed(html)
    parser.close()
    return parser.found


def check(family: str, data: bytes, result: dict[str, Any]) -> list[str]:
    """What is wrong with one decode's result."""
    problems = []
    if "raised" in result:
        problems.append(f"the decoder raised {result['raised']}")
    if result["seconds"] > TIME_FIXED + TIME_PER_BYTE * len(data):
        problems.append(f"took {result['seconds']:.2f} s for {len(data)} bytes")
    if result["peak_growth"] > EXPANSION * len(data) + EXPANSION_SLACK:
        problems.append(f"raised peak memory by {result['peak_growth']} bytes for {len(data)} bytes")
    for mime, value in result.get("shown", {}).items():
        if mime in ("text/html", "image/svg+xml"):
            problems += [f"{mime} keeps {bad}" for bad in unsafe_markup(value)]
    return problems


@pytest.mark.parametrize("family", list(SEEDS))
def test_malformed_input_is_refused_within_bounds(family: str, decode_child: DecodeChild, tmp_path: Path) -> None:
    wrap = WRAP.get(family, lambda data: data)
    for sample in SEEDS[family]:  # the valid seeds decode (and warm the child's libraries up)
        result = decode_child.decode(DECODER[family], wrap(sample))
        assert "raised" not in result and not result.get("skipped") and "refused" not in result, result
    deadline, cases, slowest, most = time.monotonic() + SECONDS, 0, 0.0, 0
    while time.monotonic() < deadline and cases < MAX_CASES:
        rng = random.Random(f"{SEED}/{family}/{cases}")
        data = wrap(mutate(rng.choice(SEEDS[family]), rng))
        try:
            result = decode_child.decode(DECODER[family], data)
            problems = check(family, data, result)
            slowest, most = max(slowest, result["seconds"]), max(most, result["peak_growth"])
        except AssertionError as exc:  # the child died
            problems = [str(exc)]
        if problems:
            saved = tmp_path / f"case-{cases}.bin"
            saved.write_bytes(data)
            pytest.fail(f"{family} case {cases} (seed {SEED}, input in {saved}): " + "; ".join(problems)[:3000])
        cases += 1
    assert cases >= 50, f"only {cases} {family} cases ran in {SECONDS} s: the time box is too small to mean much"
    print(f"{family}: {cases} malformed inputs in {SECONDS:g} s, all within bounds (slowest {slowest * 1000:.1f} ms, "
          f"largest peak growth {most >> 10} KiB)")
