"""The options of ``%%gpu_offload``, defined once: the parser, the list of valid names and the usage line
in error messages are all built from :data:`ARGUMENTS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from IPython.core.magic_arguments import argument, magic_arguments

F = TypeVar("F", bound=Callable[..., Any])

ARGUMENTS = (
    argument("--gpus", type=int, default=None, metavar="N", help="GPUs for the cell (default 1; 0: CPU)."),
    argument("--gpu-model", default=None, metavar="NAME[,NAME]",
             help="GPU model to ask for, e.g. A100, or A100,H100 for the first with room in that order "
                  "(default: $GPU_OFFLOAD_GPU_MODEL, else any)."),
    argument("--cluster", default=None, metavar="ID|auto", help="Remote cluster id, or auto (default)."),
    argument("--in", dest="inputs", default=None, metavar="a,b", help="Also send these variables."),
    argument("--out", dest="outputs", default=None, metavar="c,d", help="Also copy these back (required)."),
    argument("--session", default=None, metavar="NAME", help="Run in a warm runner that keeps its state."),
    argument("--noblock", action="store_true", help="Return a handle at once; %%gpu_result shows it."),
    argument("--timeout", type=float, default=None, metavar="SECONDS", help="Interrupt after this long."),
    argument("--queue-timeout", type=float, default=None, metavar="SECONDS",
             help="With queueing on: give up when the cell still waits in the queue after this long."),
    argument("--priority", default=None, metavar="CLASS",
             help="Kueue priority class when queueing is on, e.g. batch (default: $GPU_OFFLOAD_PRIORITY)."),
    argument("--image", default=None, metavar="IMAGE", help="Container image (cluster backends)."),
    argument("--backend", default=None, metavar="local|kubernetes", help="Override the default backend."),
    argument("--trusted-only", action="store_true",
             help="Run only on a cluster your notebook trusts: a donor sees the cell's code and inputs."),
    argument("--nodes", type=int, default=None, metavar="N",
             help="Run the cell as torch.distributed ranks on N nodes (pods), as torchrun would "
                  "(docs/distributed.md); --gpus is then per node."),
    argument("--procs-per-node", type=int, default=None, metavar="P",
             help="Rank processes per node (default: --gpus, or 1 with --gpus 0); alone it means --nodes 1."),
    argument("--out-rank", type=int, default=None, metavar="R",
             help="The rank whose variables come back (default 0)."),
    argument("--group-output", action="store_true",
             help="Show each rank's output together, rank by rank, when the cell ends."),
    argument("--quiet-ranks", action="store_true", help="Show the output of rank 0 only."),
    argument("--rendezvous-timeout", type=float, default=None, metavar="SECONDS",
             help="Seconds every rank has to start after the first one did (default 300)."),
    argument("--spread", action="store_true",
             help="Let the nodes of a distributed run span donors (not with queueing on)."),
)
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
