"""Command line of the runner: ``python runner.pyz --bundle PATH`` or ``--session`` (see the protocol doc)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import watchdog
from .bundle import BundleError, read_bundle
from .frames import check_nonce
from .runtime import MISMATCH_EXIT, STATUS_EXIT, Runtime

NONCE_ENV = "GPU_OFFLOAD_NONCE"
"""Where a session runner finds its frame nonce (a one-shot runner reads it from its bundle)."""
USAGE_EXIT = 2
EXIT_GRACE_SECONDS = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runner.pyz", description="Run offloaded Jupyter cells and answer with framed events."
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bundle", metavar="PATH", help="run this one bundle and exit")
    mode.add_argument("--session", action="store_true", help="read JSON commands from stdin")
    parser.add_argument("--parent-pid", type=int, metavar="PID", help="exit when this process dies")
    return parser


def _refuse(message: str) -> int:
    # no nonce, no frames: a plain sentence on stderr is all the engine can be given
    sys.stderr.write(f"gpu-offload runner: {message}\n")
    return USAGE_EXIT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the zipapp; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.session:
        nonce = os.environ.pop(NONCE_ENV, "")
        try:
            check_nonce(nonce)
        except ValueError as exc:
            return _refuse(f"--session needs {NONCE_ENV} set to the frame nonce: {exc}")
        runtime = Runtime(nonce, session=True)
        runtime.start(args.parent_pid)
        from .session import serve

        code = serve(runtime)
        runtime.close()
        return code
    try:
        bundle = read_bundle(args.bundle)
        check_nonce(bundle["nonce"])
    except (BundleError, ValueError) as exc:
        return _refuse(str(exc))
    runtime = Runtime(bundle["nonce"], session=False)
    try:
        runtime.start(args.parent_pid)
        if runtime.version_mismatch(bundle["python"]):
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
