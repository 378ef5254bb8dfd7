"""Command line of the runner: ``python runner.pyz --bundle PATH|-`` or ``--session`` (see the protocol doc)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import secrecy, watchdog
from .bundle import BundleError, parse_bundle, read_bundle
from .runtime import MISMATCH_EXIT, STATUS_EXIT, Runtime, prepare_imports
from .wire import check_nonce

USAGE_EXIT = 2
EXIT_GRACE_SECONDS = 5.0
STDIN = "-"
"""``--bundle -``: the bundle is all of stdin (the local backend's one-shot runs)."""


USAGE = ("usage: runner.pyz (--bundle PATH | --bundle - | --session) [--parent-pid PID] "
         "[--group-rank G | --rank R] [--preimport MODULE[,MODULE]]")


class Arguments(NamedTuple):
    """The runner's command line (three options: argparse and gettext would add ~40 ms to a cold start; a
    NamedTuple, as dataclasses with inspect would add another 10 ms of CPU)."""

    bundle: str | None
    session: bool
    parent_pid: int | None
    rank: int | None = None
    """``--rank R``: run the bundle as rank R of a distributed run (started by the node's launcher)."""
    group_rank: int | None = None
    """``--group-rank G``: launch node G's ranks of a bundle with ``ranks`` (docs/distributed.md)."""
    preimport: tuple[str, ...] = ()
    """``--preimport torch``: modules a one-shot runner imports while its bundle is on its way (:mod:`.preimport`)."""


def parse_arguments(argv: Sequence[str]) -> Arguments:
    """Parse the command line; raise ``ValueError`` with the usage line on anything else."""
    bundle, session = None, False
    preimport: tuple[str, ...] = ()
    numbers: dict[str, int] = {}
    items = list(argv)
    while items:
        item = items.pop(0)
        name, _, inline = item.partition("=")
        if name == "--session" and not inline:
            session = True
        elif name in ("--bundle", "--parent-pid", "--rank", "--group-rank", "--preimport") and (inline or items):
            value = inline or items.pop(0)
            if name == "--bundle":
                bundle = value
            elif name == "--preimport":
                from .preimport import parse_modules

                try:
                    preimport = parse_modules(value)
                except ValueError as exc:
                    raise ValueError(f"{exc}. {USAGE}") from None
            elif value.isdigit():
                numbers[name] = int(value)
            else:
                raise ValueError(f"{name} {value}: not a number. {USAGE}")
        else:
            raise ValueError(f"unexpected argument {item!r}. {USAGE}")
    if session == (bundle is not None):
        raise ValueError(f"give exactly one of --bundle PATH and --session. {USAGE}")
    if "--rank" in numbers and "--group-rank" in numbers:
        raise ValueError(f"give --rank (a rank process) or --group-rank (a node's launcher), not both. {USAGE}")
    if preimport and (session or "--rank" in numbers or "--group-rank" in numbers):
        raise ValueError(f"--preimport is for a one-shot run of a bundle (--bundle), not a session or ranks. {USAGE}")
    return Arguments(bundle, session, numbers.get("--parent-pid"), numbers.get("--rank"), numbers.get("--group-rank"),
                     preimport)


def _refuse(message: str) -> int:
    # no nonce, no frames: a plain sentence on stderr is all the engine can be given
    sys.stderr.write(f"gpu-offload runner: {message}\n")
    return USAGE_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the zipapp; returns the exit code."""
    try:
        args = parse_arguments(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        return _refuse(str(exc))
    # before the nonce is read: from here on a subprocess of the cell cannot look into this process
    secrecy.make_undumpable()
    if not args.preimport:
        return _serve(args, None)
    from .preimport import Preimport

    prepare_imports()  # the environment and import hooks the cell's own import would have found
    loading = Preimport(args.preimport)
    try:
        code = _serve(args, loading)
    except KeyboardInterrupt:  # while the bundle was on its way: no frame can be sent without its nonce
        code = STATUS_EXIT["interrupted"]
    if loading.running:
        # the run never waited for it (a refused bundle, an interrupt before the cell): an interpreter shutting
        # down under a thread half-way through loading an extension module may crash and change the exit code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _serve(args: Arguments, loading: Any) -> int:
    """The runner's work once the process is set up; ``loading``: its ``preimport.Preimport``, if any."""
    if args.session:
        try:
            nonce, ranks = secrecy.read_greeting(0)
            check_nonce(nonce)
            if ranks is not None and args.rank is None:
                from .ranks import node_shape

                node_shape(ranks, args.group_rank, os.environ)
        except ValueError as exc:
            return _refuse(f"--session needs its frame nonce as the first command: {exc}")
        if ranks is not None and args.rank is None:
            return _launch_session(nonce, ranks, args)
        runtime = Runtime(nonce, session=True, rank=args.rank)
        runtime.start(args.parent_pid)
        from .session import serve

        code = serve(runtime)
        runtime.close()
        return code
    try:
        if args.bundle == STDIN:
            bundle = parse_bundle(secrecy.read_stdin_bundle(0), "the bundle on stdin")
        else:
            bundle = read_bundle(str(args.bundle))
        check_nonce(bundle["nonce"])
        if args.rank is None and bundle["ranks"] is not None:
            from .ranks import node_shape

            node_shape(bundle["ranks"], args.group_rank, os.environ)  # refused here, before any rank starts
    except (BundleError, ValueError) as exc:
        return _refuse(str(exc))
    if args.rank is None and bundle["ranks"] is not None:
        return _launch(bundle, args)
    if args.rank is not None and bundle["ranks"] is None:
        return _refuse("--rank needs a bundle of a distributed run (one with a ranks field)")
    runtime = Runtime(bundle["nonce"], session=False, rank=args.rank)
    runtime.preimport = loading
    try:
        runtime.start(args.parent_pid)
        if runtime.version_mismatch(bundle["python"], bundle["run_id"]):
            return MISMATCH_EXIT
        status = runtime.run(bundle)
    except KeyboardInterrupt:  # before the cell started: nothing ran, nothing to keep
        runtime.encoder.emit("done", status="interrupted", elapsed=0.0)
        return STATUS_EXIT["interrupted"]
    runtime.interrupts.one_shot = False  # the run is over: a late signal must not raise in the shutdown
    runtime.close()
    # threads the cell left running would keep the interpreter from exiting: they get a grace period
    # (the engine, which is alive, deals with subprocesses left in the runner's process group)
    watchdog.hard_exit_later(STATUS_EXIT[status], grace=EXIT_GRACE_SECONDS, kill_group=False)
    return STATUS_EXIT[status]


def _launch(bundle: dict[str, object], args: Arguments) -> int:
    """This runner is a node's launcher: its ranks run the bundle (see :mod:`.ranks`)."""
    from .bundle import encode_bundle
    from .ranks import launch

    try:
        return launch(bundle, encode_bundle(bundle), args.group_rank, args.parent_pid)
    except (OSError, ValueError) as exc:
        return _refuse(f"cannot start this node's ranks: {exc}")


def _launch_session(nonce: str, ranks: dict[str, int], args: Arguments) -> int:
    """This runner is a distributed session's node launcher (see :mod:`.ranks`)."""
    from .ranks import serve_node

    try:
        return serve_node(nonce, ranks, args.group_rank, args.parent_pid)
    except (OSError, ValueError) as exc:
        return _refuse(f"cannot start this node's ranks: {exc}")


if __name__ == "__main__":
    sys.exit(main())
