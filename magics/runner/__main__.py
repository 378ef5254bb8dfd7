"""Command line of the runner: ``python runner.pyz --bundle PATH|-`` or ``--session`` (see the protocol doc)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from . import secrecy, watchdog
from .bundle import BundleError, parse_bundle, read_bundle
from .runtime import MISMATCH_EXIT, STATUS_EXIT, Runtime
from .wire import check_nonce

USAGE_EXIT = 2
EXIT_GRACE_SECONDS = 5.0
STDIN = "-"
"""``--bundle -``: the bundle is all of stdin (the local backend's one-shot runs)."""


USAGE = "usage: runner.pyz (--bundle PATH | --bundle - | --session) [--parent-pid PID]"


@dataclass(frozen=True)
class Arguments:
    """The runner's command line (three options: argparse and gettext would add ~40 ms to a cold start)."""

    bundle: str | None
    session: bool
    parent_pid: int | None


def parse_arguments(argv: Sequence[str]) -> Arguments:
    """Parse the command line; raise ``ValueError`` with the usage line on anything else."""
    bundle, session, parent_pid = None, False, None
    items = list(argv)
    while items:
        item = items.pop(0)
        name, _, inline = item.partition("=")
        if name == "--session" and not inline:
            session = True
        elif name in ("--bundle", "--parent-pid") and (inline or items):
            value = inline or items.pop(0)
            if name == "--bundle":
                bundle = value
            elif value.isdigit():
                parent_pid = int(value)
            else:
                raise ValueError(f"--parent-pid {value}: not a process id. {USAGE}")
        else:
            raise ValueError(f"unexpected argument {item!r}. {USAGE}")
    if session == (bundle is not None):
        raise ValueError(f"give exactly one of --bundle PATH and --session. {USAGE}")
    return Arguments(bundle, session, parent_pid)


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
    if args.session:
        try:
            nonce = check_nonce(secrecy.read_greeting(0))
        except ValueError as exc:
            return _refuse(f"--session needs its frame nonce as the first command: {exc}")
        runtime = Runtime(nonce, session=True)
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
    except (BundleError, ValueError) as exc:
        return _refuse(str(exc))
    runtime = Runtime(bundle["nonce"], session=False)
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


if __name__ == "__main__":
    sys.exit(main())
