"""The options of a run, defined once for every front end: ``%%gpu_offload``'s arguments, ``gpu-offload run``'s
parser and the command line of its detached follower (``--noblock``) are all built from :data:`TABLE`.

An option is added in one line here; a front end that should not offer it says so (``magic=False`` or
``shell=False``), so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORKDIR_LIMIT_MB = 10.0
"""Default cap on the directory ``gpu-offload run`` ships with a script."""


@dataclass(frozen=True)
class Option:
    """One option: its flag, what it means, and which front ends offer it."""

    flag: str
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    """Converts the word given (None: kept as text)."""
    switch: bool = False
    """Takes no value: given means on."""
    dest: str | None = None
    magic: bool = True
    """``%%gpu_offload`` offers it (its default is always None: the magic's configuration or the engine decides)."""
    shell: bool = True
    """``gpu-offload run`` offers it."""
    shell_default: Any = None
    shell_choices: tuple[str, ...] | None = None
    repeat: bool = False
    """``gpu-offload run`` takes it several times (a list)."""
    hidden: bool = False
    """Not listed in ``--help``: set by the command itself, not by a user."""

    @property
    def name(self) -> str:
        """The attribute the parsed value lands in."""
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def magic_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the magic's ``argument(...)`` (IPython's, argparse's own)."""
        kwargs: dict[str, Any] = {"help": self.help}
        if self.dest:
            kwargs["dest"] = self.dest
        if self.switch:
            return {**kwargs, "action": "store_true"}
        kwargs["default"] = None
        if self.type is not None:
            kwargs["type"] = self.type
        if self.metavar:
            kwargs["metavar"] = self.metavar
        return kwargs

    def shell_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``gpu-offload run``'s ``parser.add_argument(...)``."""
        kwargs: dict[str, Any] = {"help": argparse.SUPPRESS if self.hidden else self.help}
        if self.dest:
            kwargs["dest"] = self.dest
        if self.switch:
            return {**kwargs, "action": "store_true"}
        kwargs["default"] = [] if self.repeat else self.shell_default
        if self.repeat:
            kwargs["action"] = "append"
        for key, value in (("type", self.type), ("metavar", self.metavar), ("choices", self.shell_choices)):
            if value is not None:
                kwargs[key] = value
        return kwargs


def gpu_amount(word: str) -> int | float:
    """``--gpus``: a whole number of GPUs, or part of one (``0.5``); ``OffloadRequest`` checks the range."""
    try:
        value = float(word)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{word!r} is not a number of GPUs: give a whole number (2), 0 for CPU, "
                                         "or part of one GPU (0.5)")
    return int(value) if value.is_integer() else value


TABLE: tuple[Option, ...] = (
    Option("--gpus", "GPUs for the run (default 1; 0: CPU; 0.5: half of one GPU, from a donor that shares GPUs, "
           "docs/sharing.md).", "N", gpu_amount, shell_default=1),
    Option("--gpu-memory", "GPU memory the run needs, e.g. 12Gi: part of one GPU, sized by memory, from a donor "
           "that shares GPUs (docs/sharing.md).", "SIZE"),
    Option("--estimate", "Work out the GPU memory a cell training a torch model needs (on no GPU) and ask for "
           "that much; a cell run before asks for its measured peak plus a margin.", switch=True, shell=False),
    Option("--gpu-model", "GPU model to ask for, e.g. A100, or A100,H100 for the first with room in that order "
           "(default: $GPU_OFFLOAD_GPU_MODEL, else any).", "NAME[,NAME]"),
    Option("--cluster", "Remote cluster id, or auto (default).", "ID|auto", shell_default="auto"),
    Option("--in", "Also send these variables.", "a,b", dest="inputs", shell=False),
    Option("--in", "Ship this file too (repeatable).", "FILE", Path, dest="inputs", magic=False, repeat=True),
    Option("--out", "Also copy these back (required).", "c,d", dest="outputs", shell=False),
    Option("--session", "Run in a warm runner that keeps its state.", "NAME", shell=False),
    Option("--idle-timeout", "With --session: release the session's GPUs after this many idle minutes, "
           "checkpointing it first (at most the hub's default; docs/sessions.md).", "MINUTES", float, shell=False),
    Option("--noblock", "Return at once: %%gpu_result shows a cell's result; a script's run goes on in the "
           "background (gpu-offload logs RUN -f).", switch=True),
    Option("--timeout", "Interrupt after this long (counted from Kueue's admission when it queues).", "SECONDS",
           float),
    Option("--queue-timeout", "With queueing on: give up when the run still waits in the queue after this long "
           "(docs/queueing.md).", "SECONDS", float),
    Option("--priority", "Kueue priority class when queueing is on, e.g. batch (default: $GPU_OFFLOAD_PRIORITY).",
           "CLASS"),
    Option("--image", "Container image (cluster backends).", "IMAGE"),
    Option("--backend", "Override the default backend (default: kubernetes when a cluster is configured, else "
           "local).", "local|kubernetes", shell_choices=("local", "kubernetes")),
    Option("--trusted-only", "Run only on a cluster the origin trusts: a donor sees the code and its inputs "
           "(default: $GPU_OFFLOAD_TRUSTED_ONLY, which a hub's chart sets).", switch=True),
    Option("--rerun-on-preemption", "A run preempted before it finished is queued again and rerun once even if it "
           "printed something already (without it, only one that printed nothing is; docs/sessions.md).",
           switch=True),
    Option("--max-workdir-mb", f"Cap on the shipped directory (default {WORKDIR_LIMIT_MB:g} MB).", "MB", float,
           magic=False, shell_default=WORKDIR_LIMIT_MB),
    Option("--nodes", "Run as torch.distributed ranks on N nodes (pods), as torchrun would (docs/distributed.md); "
           "--gpus is then per node.", "N", int),
    Option("--procs-per-node", "Rank processes per node (default: --gpus, or 1 with --gpus 0); alone it means "
           "--nodes 1.", "P", int),
    Option("--out-rank", "The rank whose variables come back (default 0).", "R", int, shell=False),
    Option("--group-output", "Show each rank's output together, rank by rank, when the run ends.", switch=True),
    Option("--quiet-ranks", "Show the output of rank 0 only.", switch=True),
    Option("--rendezvous-timeout", "Seconds every rank has to start after the first one did (default 300).",
           "SECONDS", float),
    Option("--spread", "Let the nodes of a distributed run span donors (not with queueing on).", switch=True),
    Option("--detached-log", "The log file of a background run's follower.", magic=False, hidden=True),
)
"""In the order ``%%gpu_offload?`` and ``gpu-offload run --help`` list them."""

MAGIC = tuple(option for option in TABLE if option.magic)
SHELL = tuple(option for option in TABLE if option.shell)

NOT_CARRIED = frozenset({"--noblock", "--detached-log"})
"""What a detached follower does not take again: it is the background run, with its own log."""


def add_shell_options(parser: argparse.ArgumentParser) -> None:
    """Give ``gpu-offload run``'s parser every option of the table it offers."""
    for option in SHELL:
        parser.add_argument(option.flag, **option.shell_kwargs())


def carried_argv(args: argparse.Namespace) -> list[str]:
    """The options of a parsed ``gpu-offload run`` as words again, but the ones a follower does not take."""
    words: list[str] = []
    for option in SHELL:
        if option.flag in NOT_CARRIED:
            continue
        value = getattr(args, option.name)
        if option.switch:
            words += [option.flag] if value else []
        elif option.repeat:
            for item in value:
                words += [option.flag, str(item)]
        elif value is not None:
            words += [option.flag, str(value)]
    return words
