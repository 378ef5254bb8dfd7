"""The options of ``%%gpu_offload``: the parser, the list of valid names and the usage line in error messages
are all built from the one option table, :data:`gpu_offload.engine.options.TABLE`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core.magic_arguments import argument, magic_arguments

from ..engine.options import MAGIC

F = TypeVar("F", bound=Callable[..., Any])

ARGUMENTS = tuple(argument(option.flag, **option.magic_kwargs()) for option in MAGIC)
"""In the order ``%%gpu_offload?`` lists them."""

OPTIONS: tuple[str, ...] = tuple(arg.args[0] for arg in ARGUMENTS)
"""The option names, for "did you mean" hints."""

USAGE = ", ".join(
    f"{arg.args[0]} {arg.kwds['metavar']}" if "metavar" in arg.kwds else arg.args[0] for arg in ARGUMENTS
)
"""``--gpus N, --gpu-model NAME, ...``: the options as error messages list them."""


def cell_arguments(func: F) -> F:
    """Give the cell magic its parser (``prog`` is ``%gpu_offload``, so the usage line reads ``%%gpu_offload``)."""
    for arg in reversed(ARGUMENTS):  # IPython adds decorators bottom-up and builds the parser top-down
        func = arg(func)
    return magic_arguments("%gpu_offload")(func)  # type: ignore[no-any-return]
