"""Help as plain text: the sub-commands' descriptions are their modules' docstrings, written for readers of the
code (reST roles, double back-quotes); ``--help`` shows them without that markup, paragraphs kept."""

from __future__ import annotations

import argparse
import inspect
import re
from typing import Any

_ROLE = re.compile(r":[a-z]+:`~?\.?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` without reST markup: roles give their target (``:func:`run``` -> ``run``), literals their text,
    a literal block's ``::`` a colon."""
    text = _ROLE.sub(lambda m: m.group(1), inspect.cleandoc(text))
    text = _LITERAL.sub(lambda m: m.group(1), text)
    return re.sub(r"::$", ":", text, flags=re.M)


class PlainParser(argparse.ArgumentParser):
    """An ArgumentParser whose description, epilog and argument help are shown as plain text, paragraphs kept
    (every sub-command's parser is one: ``add_subparsers`` passes the class on)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        for key in ("description", "epilog"):
            if kwargs.get(key):
                kwargs[key] = plain_text(kwargs[key])
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_text(kwargs["help"]).replace("\n", " ")
        return super().add_argument(*args, **kwargs)
