"""What one offloaded cell asks for: the frozen :class:`OffloadRequest`, validated on creation."""

from __future__ import annotations

import argparse
import keyword
import math
from dataclasses import dataclass
from typing import Any

from .backends.base import Ranks, RunAsks
from .errors import OffloadUsageError
from .ranked import GROUPED, LIVE, RANK0

BACKENDS = ("local", "kubernetes")
RENDEZVOUS_TIMEOUT = 300.0
"""Seconds every rank of a distributed run has to start after the first (``--rendezvous-timeout``)."""


@dataclass(frozen=True)
class OffloadRequest(RunAsks):
    """One ``%%gpu_offload`` invocation, after parsing and before analysis of the cell: what it asks of a run
    (:class:`RunAsks`, keywords only) and what only the cell decides."""

    cell: str
    """The cell body (without the ``%%gpu_offload`` line)."""
    inputs: tuple[str, ...] = ()
    """Names to send in addition to those the cell reads (``--in``)."""
    outputs: tuple[str, ...] = ()
    """Names to copy back in addition to those the cell assigns; failing to copy one is an error."""
    session: str | None = None
    """A warm runner whose state persists across cells; ``None`` starts a fresh runner."""
    noblock: bool = False
    """Return a handle at once instead of following the run."""
    backend: str | None = None
    """``local`` or ``kubernetes``; ``None`` uses the configured default."""
    queue_timeout: float | None = None
    """Seconds a run may wait in the queue (queueing on) before it is withdrawn; ``None`` waits as long as it takes."""
    nodes: int | None = None
    """``--nodes``: run as the ranks of a distributed run on this many nodes; ``None``: one runner."""
    procs_per_node: int | None = None
    """``--procs-per-node``: rank processes per node; ``None``: one per GPU, or one on CPU."""
    out_rank: int | None = None
    """``--out-rank``: the rank whose variables come back; ``None``: rank 0."""
    group_output: bool = False
    """``--group-output``: each rank's output together when the cell ends."""
    quiet_ranks: bool = False
    """``--quiet-ranks``: rank 0's output only."""
    rendezvous_timeout: float | None = None
    """``--rendezvous-timeout``: seconds every rank has to start after the first; ``None``: the default."""
    spread: bool = False
    """``--spread``: the nodes may span donors."""
    estimate: bool = False
    """``--estimate``: size ``gpu_memory`` from the cell's model (``engine.estimate``) when it is not given."""

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise OffloadUsageError(
                f"--gpus {self.gpus}: the number of GPUs cannot be negative. "
                "Write --gpus 1 for one GPU, or --gpus 0 to run on CPU."
            )
        if self.timeout is not None and self.timeout <= 0:
            raise OffloadUsageError(
                f"--timeout {self.timeout:g}: the timeout must be a positive number of seconds, "
                "e.g. --timeout 600; leave it out to wait without a limit."
            )
        if self.queue_timeout is not None and self.queue_timeout <= 0:
            raise OffloadUsageError(
                f"--queue-timeout {self.queue_timeout:g}: give a positive number of seconds, e.g. --queue-timeout "
                "300; leave it out to wait in the queue as long as it takes."
            )
        if self.backend is not None and self.backend not in BACKENDS:
            raise OffloadUsageError(
                f"--backend {self.backend}: unknown backend. Write --backend local or --backend kubernetes."
            )
        for option, names in (("--in", self.inputs), ("--out", self.outputs)):
            for name in names:
                if not name.isidentifier() or keyword.iskeyword(name):
                    raise OffloadUsageError(
                        f"{option} {','.join(names)}: `{name}` is not a Python variable name. "
                        f"Write a comma-separated list of names, e.g. {option} a,b."
                    )
        if self.priority is not None and not _is_class_name(self.priority):
            raise OffloadUsageError(
                f"--priority {self.priority!r}: a priority class is a lowercase name of letters, digits and '-', "
                "e.g. --priority batch (`gpu-offload queues` lists the classes)."
            )
        if self.session is not None and not _is_session_name(self.session):
            raise OffloadUsageError(
                f"--session {self.session!r}: a session name uses letters, digits, '-', '_' or '.' "
                "(up to 63 characters), e.g. --session train."
            )
        _check_idle_timeout(self)
        _check_distributed(self)
        _check_fraction(self)

    @property
    def ranks(self) -> Ranks | None:
        """The distributed run's shape, or ``None`` for a cell run by one runner."""
        if self.nodes is None and self.procs_per_node is None:
            return None
        procs = self.procs_per_node if self.procs_per_node is not None else max(self.gpus, 1)
        return Ranks(
            nodes=1 if self.nodes is None else self.nodes,
            procs_per_node=procs,
            out_rank=self.out_rank or 0,
            rendezvous_timeout=RENDEZVOUS_TIMEOUT if self.rendezvous_timeout is None else self.rendezvous_timeout,
            spread=self.spread,
        )

    @property
    def show(self) -> str:
        """How the ranks' output is shown (:mod:`.ranked`)."""
        return GROUPED if self.group_output else RANK0 if self.quiet_ranks else LIVE


def _check_idle_timeout(request: OffloadRequest) -> None:
    """``--idle-timeout`` is a session's, in positive minutes."""
    if request.idle_timeout is None:
        return
    minutes = request.idle_timeout / 60
    if request.session is None:
        raise OffloadUsageError(
            f"--idle-timeout {minutes:g}: only a session is released when idle; add --session NAME, or leave "
            "--idle-timeout out (a cell without a session gives its GPU back when it ends)."
        )
    if not (minutes > 0 and math.isfinite(minutes)):
        raise OffloadUsageError(
            f"--idle-timeout {minutes:g}: give a positive number of minutes, e.g. --idle-timeout 15; leave it out "
            "for the hub's default (`%gpu_offload status` shows it)."
        )


DISTRIBUTED_ONLY = ("--out-rank", "--group-output", "--quiet-ranks", "--rendezvous-timeout", "--spread")


def _check_distributed(request: OffloadRequest) -> None:
    """The options of a distributed run make sense together; each refusal says what to write instead."""
    given = [option for option, value in (
        ("--out-rank", request.out_rank is not None), ("--group-output", request.group_output),
        ("--quiet-ranks", request.quiet_ranks), ("--rendezvous-timeout", request.rendezvous_timeout is not None),
        ("--spread", request.spread)) if value]
    if request.nodes is None and request.procs_per_node is None:
        if given:
            raise OffloadUsageError(
                f"{', '.join(given)}: only a distributed run has ranks. Add --nodes N (e.g. --nodes 2), or "
                f"leave {'it' if len(given) == 1 else 'them'} out."
            )
        return
    if request.nodes is not None and request.nodes < 1:
        raise OffloadUsageError(f"--nodes {request.nodes}: a distributed run needs at least one node, e.g. --nodes 2.")
    if request.procs_per_node is not None:
        if request.procs_per_node < 1:
            raise OffloadUsageError(
                f"--procs-per-node {request.procs_per_node}: each node runs at least one rank, e.g. "
                "--procs-per-node 2."
            )
        if request.gpus > 0 and request.procs_per_node > request.gpus:
            raise OffloadUsageError(
                f"--procs-per-node {request.procs_per_node} with --gpus {request.gpus}: more ranks than GPUs on "
                "a node, and nccl refuses two ranks on one GPU. Write --procs-per-node "
                f"{request.gpus} or fewer, or --gpus 0 for CPU ranks (gloo)."
            )
    shape = request.ranks
    assert shape is not None
    if not 0 <= shape.out_rank < shape.world_size:
        raise OffloadUsageError(
            f"--out-rank {request.out_rank}: the run has ranks 0 to {shape.world_size - 1} ({shape.nodes} node(s) "
            f"x {shape.procs_per_node} process(es)). Choose one of them, or leave --out-rank out for rank 0."
        )
    if request.group_output and request.quiet_ranks:
        raise OffloadUsageError(
            "--group-output and --quiet-ranks: choose one (every rank's output grouped at the end, or rank 0's "
            "only)."
        )
    if shape.rendezvous_timeout <= 0:
        raise OffloadUsageError(
            f"--rendezvous-timeout {shape.rendezvous_timeout:g}: give a positive number of seconds, e.g. "
            "--rendezvous-timeout 600, or leave it out for 300."
        )


def gpus_and_fraction(value: float) -> tuple[int, float | None]:
    """``--gpus`` as the request holds it: whole GPUs, or one GPU of which ``fraction`` is asked for."""
    if 0 < value < 1:
        return 1, float(value)
    if value != int(value):
        raise OffloadUsageError(
            f"--gpus {value:g} mixes whole GPUs and a fraction: shares of two GPUs are not one GPU. Ask for whole "
            f"GPUs (--gpus {int(value) + 1}) or part of one (--gpus 0.5).")
    return int(value), None


def memory_size(text: str | None) -> int | None:
    """``--gpu-memory 12Gi`` in bytes (``None`` when not given); a clear error when it is not a size."""
    if text is None:
        return None
    from kubernetes.utils import parse_quantity

    try:
        size = int(parse_quantity(text.strip()))
    except ValueError:
        size = 0
    if size <= 0:
        raise OffloadUsageError(f"--gpu-memory {text!r} is not a size of memory. Write it like 12Gi or 500Mi.")
    return size


def _check_fraction(request: OffloadRequest) -> None:
    """Part of a GPU is part of one GPU, for one runner."""
    if request.fraction is not None and not 0 < request.fraction < 1:
        raise OffloadUsageError(f"--gpus {request.fraction:g}: part of a GPU is more than 0 and less than 1, "
                                "e.g. --gpus 0.5.")
    if request.gpu_memory is not None and request.gpu_memory <= 0:
        raise OffloadUsageError("--gpu-memory: give a positive size, e.g. --gpu-memory 12Gi.")
    partial = [o for o, v in (("--gpus " + format(request.fraction or 0, "g"), request.fraction),
                              ("--gpu-memory", request.gpu_memory), ("--estimate", request.estimate or None))
               if v is not None]
    if not partial:
        return
    if request.ranks is not None:
        raise OffloadUsageError(f"{' and '.join(partial)} with --nodes: the ranks of a distributed run each hold "
                                "whole GPUs. Ask for --gpus 1 per node, or run the cell without --nodes.")
    if request.gpus != 1:
        raise OffloadUsageError(f"{' and '.join(partial)} with --gpus {request.gpus}: they ask for part of one "
                                "GPU. Leave out --gpus, or ask for whole GPUs without them.")


def ignored_locally(request: OffloadRequest, default_gpu_model: str | None = None) -> list[str]:
    """The options of ``request`` that only choose where a cluster runs it, which the local backend ignores
    (a GPU model that is only the configured default was not asked for)."""
    models = ",".join((request.gpu_model, *request.fallback_models)) if request.gpu_model else None
    chosen = [option for option, value in (("--gpu-model", models), ("--image", request.image),
                                                   ("--priority", request.priority),
                                                   ("--queue-timeout", request.queue_timeout),
                                                   ("--idle-timeout", request.idle_timeout),
                                                   ("--spread", True if request.spread else None))
              if value is not None and not (option == "--gpu-model" and value == default_gpu_model)]
    return chosen + (["--cluster"] if request.cluster != "auto" else [])


def _is_class_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-")
    return 0 < len(name) <= 63 and set(name) <= allowed and name[0] != "-" and name[-1] != "-"


def _is_session_name(name: str) -> bool:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return 0 < len(name) <= 63 and set(name) <= allowed


def gpu_models(value: str | None) -> tuple[str | None, tuple[str, ...]]:
    """``--gpu-model A100,H100``: the model to ask for, then the ones placement falls back to in this order
    when it has no room (``(None, ())`` for any model)."""
    models = split_names(value)
    return (models[0] if models else None), models[1:]


def split_names(value: str | None) -> tuple[str, ...]:
    """Split ``a,b , c`` into ``("a", "b", "c")``; empty items are dropped."""
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def parsed_request(args: argparse.Namespace, cell: str, *, gpus: float, gpu_model: str | None, cluster: str,
                   trusted_only: bool, **only_here: Any) -> OffloadRequest:
    """The request of a cell or a script from its parsed options (the option table's names, which both front
    ends share), each option not given taking the front end's default (``gpus``, ``gpu_model``, ``cluster``;
    ``trusted_only`` cannot be turned off by leaving it out). ``only_here``: the fields of options one front
    end offers alone, as it reads them (the magic's ``--in`` names, ``--session``, ...). Raises
    ``OffloadUsageError`` naming the fix for a value that cannot be (``--gpus 1.5``, ``--gpu-memory lots``)."""
    model, fallback_models = gpu_models(args.gpu_model or gpu_model)
    whole, fraction = gpus_and_fraction(gpus if args.gpus is None else args.gpus)
    return OffloadRequest(
        cell=cell, gpus=whole, fraction=fraction, gpu_memory=memory_size(args.gpu_memory), gpu_model=model,
        fallback_models=fallback_models, cluster=args.cluster or cluster, timeout=args.timeout,
        queue_timeout=args.queue_timeout, priority=args.priority, image=args.image, backend=args.backend,
        trusted_only=args.trusted_only or trusted_only, rerun_on_preemption=args.rerun_on_preemption,
        nodes=args.nodes, procs_per_node=args.procs_per_node, group_output=args.group_output,
        quiet_ranks=args.quiet_ranks, rendezvous_timeout=args.rendezvous_timeout, spread=args.spread,
        **only_here,
    )

