"""``gpu-offload run SCRIPT.py [ARGS]``: a script on a GPU runner through the magic's engine, streamed here.

The script and its directory (``.gitignore`` honoured, size-capped; :mod:`.workdir`) become one bundle that
runs as ``python SCRIPT ARGS`` would (:mod:`gpu_offload.runner.script`). The run is recorded in the
state directory beside the notebook's runs, so ``gpu-offload runs`` and the panel list it. The command
exits with the script's exit code, 130 on Ctrl-C (which stops the run remotely, as in a notebook) and
124 when ``--timeout`` or ``--queue-timeout`` ran out. ``--noblock`` hands the run to a detached follower (:mod:`.background`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.backends.base import Backend
from ..engine.errors import OffloadError
from ..liqo_peering.environment import InvalidSetting
from ..liqo_peering.settings import RunDefaults, kernel_settings, run_defaults

if TYPE_CHECKING:
    from ..engine.request import OffloadRequest


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``run`` on the ``gpu-offload`` command."""
    from ..engine.options import add_shell_options

    parser = subparsers.add_parser("run", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("script", type=Path, help="the Python script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")
    add_shell_options(parser)  # the one option table the magic's arguments come from too
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the script here, or hand it to a background follower with ``--noblock``."""
    if args.noblock:
        from .background import start_detached

        return start_detached(args)
    try:
        return follow_script(args)
    except OffloadError as exc:
        print(f"gpu-offload run: {exc}", file=sys.stderr)
        return 2


def command_line(args: argparse.Namespace) -> str:
    """The script and its arguments, as the run's record shows them."""
    return shlex.join([str(args.script), *args.script_args])


def cli_kernel() -> str:
    """The 'kernel' a CLI run is recorded and labelled under: this command, on this host."""
    return f"cli-{socket.gethostname()}-{os.getpid()}"


def make_backend(name: str | None) -> Backend:
    """The backend the magic would choose (``auto``: a configured cluster, else local), set up for a CLI run."""
    from ..engine.backends import registry

    return registry.create(name or registry.auto_name(os.environ), cli_kernel=cli_kernel())


def script_request(args: argparse.Namespace, source: str, defaults: RunDefaults) -> OffloadRequest:
    """The request of a parsed ``gpu-offload run``: its options, else the run defaults (a hub's spawner writes
    them for the user's server and its terminals inherit them), as the magic applies them to a cell. Raises
    ``OffloadUsageError`` for a part of a GPU that cannot be (``--gpus 1.5``, ``--gpu-memory lots``)."""
    from ..engine.request import parsed_request

    return parsed_request(args, source, gpus=1, gpu_model=defaults.gpu_model, cluster="auto",
                          trusted_only=defaults.trusted_only)


def _source(script: Path) -> str:
    """The script's text, decoded as Python decodes a source file (UTF-8 unless a coding line says otherwise)."""
    import tokenize

    with tokenize.open(script) as handle:
        return handle.read()


def follow_script(args: argparse.Namespace) -> int:
    """Pack, submit and follow the script in this process; returns its exit code."""
    from ..engine.analysis import CellAnalysis
    from ..engine.engine import FollowSettings
    from ..engine.errors import OffloadUsageError
    from ..engine.execution import Launch, run_blocking
    from ..engine.observing import RunEvents
    from ..engine.request import ignored_locally
    from ..engine.runs.records import RunBook
    from ..engine.runs.tracking import Tracker
    from .terminal import INTERRUPTED_EXIT, TerminalSink, exit_code, report
    from .workdir import WorkdirError, pack

    script: Path = args.script
    if not script.is_file():
        print(f"gpu-offload run: {script}: no such file. Name a Python script, e.g. gpu-offload run train.py",
              file=sys.stderr)
        return 2
    try:
        workdir = pack(script, args.inputs, args.max_workdir_mb)
    except WorkdirError as exc:
        print(f"gpu-offload run: {exc}", file=sys.stderr)
        return 2
    try:
        defaults = run_defaults(kernel_settings().check("gpu_model", "trusted_only"))
    except InvalidSetting as exc:
        print(f"gpu-offload run: {exc}", file=sys.stderr)
        return 2
    try:
        request = script_request(args, _source(script), defaults)
    except OffloadUsageError as exc:
        print(f"gpu-offload run: {exc}", file=sys.stderr)
        return 2
    launch = Launch(analysis=CellAnalysis(inputs=()), filename=script.name, first_line=1,
                    script={"path": script.name, "argv": list(args.script_args), "workdir": workdir.archive})
    backend = make_backend(request.backend)
    sink = TerminalSink()
    ignored = ignored_locally(request, defaults.gpu_model) if backend.name == "local" else []
    if ignored:
        sink.notice(f"the local backend ignores {', '.join(ignored)}: they choose where a cluster runs the script")
    tracker = Tracker(RunBook(), kernel=cli_kernel(), script=command_line(args), log=args.detached_log or "")
    events = RunEvents()
    events.subscribe(tracker)  # `gpu-offload runs`, `cancel` and the panel read its record
    if args.detached_log:
        import signal

        # no terminal sends a background follower Ctrl-C: SIGTERM (kill PID, a shutdown) stops the run the same way
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    outcomes: list[Any] = []
    try:
        run_blocking(request, launch, {}, backend, sink,
                     FollowSettings(timeout=args.timeout, queue_timeout=args.queue_timeout), outcomes.append, events)
    except KeyboardInterrupt:
        sink.notice("interrupted: the run was stopped")
        return INTERRUPTED_EXIT
    except OffloadError:
        if not outcomes:
            raise  # nothing ran: a usage or cluster error, said by run()
    finally:
        backend.close()
    report(outcomes[0], sink)
    return exit_code(outcomes[0])
