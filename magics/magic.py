"""The ``%%gpu_offload`` cell magic and the ``%gpu_offload`` / ``%gpu_result`` line magics.

A parser over injected backends: it turns arguments into an :class:`OffloadRequest`, the cell into a
:class:`CellAnalysis`, and hands both to the execution layer. It holds no process or cluster code.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import functools
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import parse_argstring
from traitlets import Bool, Float, Integer, Unicode, default

from ..engine.analysis import analyse_cell
from ..engine.backends import registry
from ..engine.backends.base import Backend
from ..engine.engine import FollowSettings, Outcome, describe
from ..engine.errors import BackendNotConfigured, CellSyntaxError, OffloadUsageError
from ..engine.estimate import PeakBook
from ..engine.execution import Launch, OffloadHandle, run_blocking
from ..engine.observing import RunEvents
from ..engine.request import (
    OffloadRequest,
    ignored_locally,
    parsed_request,
    split_names,
)
from ..engine.runs.records import check_state_dir, default_state_dir
from ..engine.runs.tracking import tracker
from ..engine.sinks import NotebookSink, Sink
from ..engine.sizing import advise, oom_advice, record_peak, size
from ..engine.timing import Stopwatch, describe_timing
from ..liqo_peering.settings import KernelSettings, RunDefaults, kernel_settings, run_defaults
from . import session_commands
from .cell_options import OPTIONS, USAGE, cell_arguments

LOCAL_NOTE = (
    "no cluster is configured, so cells run on the embedded local backend (a runner process on this "
    "machine). `%gpu_offload config` shows the settings."
)


F = TypeVar("F", bound=Callable[..., Any])


def _named(marker: Callable[..., Any], name: str) -> Callable[[F], F]:
    # IPython's decorators are typed as returning a union; this keeps the decorated method's type
    return cast(Callable[[F], F], marker(name))


@magics_class
class GpuOffloadMagics(Magics):
    """Run cells in a runner process (local) or on a remote GPU; configurable as ``c.GpuOffloadMagics``."""

    backend = Unicode(
        "auto",
        config=True,
        help="Default backend: 'auto' (a configured cluster, else local), 'local' or 'kubernetes'.",
    )
    default_gpus = Integer(1, config=True, help="GPUs a cell gets when it does not say --gpus.")
    default_cluster = Unicode(
        "auto", config=True, help="Cluster a cell runs on when it does not say --cluster (the panel sets it)."
    )
    default_gpu_model = Unicode(
        None,
        allow_none=True,
        config=True,
        help="GPU model a cell asks for when it does not say --gpu-model (default: $GPU_OFFLOAD_GPU_MODEL, "
        "which a hub's GPU profile sets; None: any model).",
    )
    trusted_only = Bool(
        False,
        config=True,
        help="Run every cell on trusted clusters only, as --trusted-only does (default: "
        "$GPU_OFFLOAD_TRUSTED_ONLY, which a hub's chart sets): a donor sees a cell's code and inputs.",
    )
    progress_after = Float(
        2.0, config=True, help="Seconds without output before the magic says what a run waits for."
    )
    grace_period = Float(
        5.0, config=True, help="Seconds an interrupted one-shot runner gets to exit before it is killed."
    )

    @default("default_gpu_model")
    def _default_gpu_model(self) -> str | None:
        return self.run_defaults().gpu_model

    @default("trusted_only")
    def _default_trusted_only(self) -> bool:
        return self.run_defaults().trusted_only

    def __init__(
        self,
        shell: Any = None,
        backends: Mapping[str, Backend] | None = None,
        sink: Sink | None = None,
        settings: KernelSettings | None = None,
        **kwargs: Any,
    ) -> None:
        self._settings = settings
        """The kernel's settings when given (tests); None: this process's environment as it is now."""
        super().__init__(shell, **kwargs)
        self.ipython: Any = shell
        self._factories: dict[str, Callable[[], Backend]] = {
            name: functools.partial(registry.create, name) for name in registry.NAMES
        }
        self._backends: dict[str, Backend] = dict(backends or {})
        self._sink = sink or NotebookSink()
        self._announced = False
        self.last_handle: OffloadHandle | None = None
        self.last_outcome: Outcome | None = None
        self._parsed: dict[str, argparse.Namespace] = {}
        self.events = RunEvents()
        """Every run this magic starts is published here; the kernel's run book (the panel's) listens."""
        self.events.subscribe(tracker())
        atexit.register(self.close)

    def run_defaults(self) -> RunDefaults:
        """What a cell gets when neither its line nor ``c.GpuOffloadMagics`` says (the same for every front end)."""
        return run_defaults(self._settings or kernel_settings())

    # -- the cell magic -------------------------------------------------------------------------------

    @cell_arguments
    @_named(cell_magic, "gpu_offload")
    def gpu_offload_cell(self, line: str, cell: str) -> OffloadHandle | None:
        """Run this cell on a GPU runner; its output streams back and the variables it assigns return.

        Inputs are the notebook variables the cell reads (plus --in); modules are imported again on the
        runner. Outputs are the names the cell assigns (plus --out). Ctrl-C interrupts the cell remotely.
        Examples::

            %%gpu_offload --gpus 1
            model = train(data)

            %%gpu_offload --session train --noblock
            for epoch in range(10): step()

            %%gpu_offload --nodes 2 --gpus 4
            torch.distributed.init_process_group("nccl")  # 8 ranks, torchrun's environment
        """
        clock = Stopwatch()  # Shift-Enter: what `%gpu_offload status --timing` counts from
        request = self._request(line, cell)
        backend = self._backend(request.backend)
        if backend.name == "local":
            self._name_ignored_options(request)
        try:
            analysis = analyse_cell(cell, self.ipython.user_ns, hidden=set(self.ipython.user_ns_hidden),
                                    extra_inputs=request.inputs, extra_outputs=request.outputs)
        except CellSyntaxError as err:
            err.where = f"Cell In[{self._cell_number()}]"  # as IPython names a cell's syntax error
            raise
        clock.mark("analysis")
        key = None
        if request.estimate:  # before the launch: the request asks for what the estimate says
            sizing = size(request, analysis.inputs, self.ipython.user_ns, PeakBook(self._peaks_path()))
            request, key = sizing.request, sizing.key
            self._sink.notice(sizing.notice)
        elif (advice := advise(request, analysis.inputs, self.ipython.user_ns,
                               lambda: PeakBook(self._peaks_path()))) is not None:
            key = advice.key  # a training cell: its estimate is said, and its measured peak recorded
            self._sink.notice(advice.notice)
        launch = Launch(analysis=analysis, filename=f"<offloaded cell {self._cell_number()}>", clock=clock)
        settings = FollowSettings(self.progress_after, self.grace_period, request.timeout, request.queue_timeout)
        if request.noblock:
            handle = OffloadHandle(request, launch, self.ipython.user_ns, backend, settings, self._sink, self.events)
            self.last_handle = handle
            return handle
        run_blocking(request, launch, self.ipython.user_ns, backend, self._sink, settings,
                     lambda outcome: self._remember(outcome, request, key), self.events)
        return None

    def _remember(self, outcome: Outcome, request: OffloadRequest | None = None, key: str | None = None) -> None:
        self.last_outcome = outcome
        model = request.gpu_model if request is not None else None
        if key is not None and record_peak(PeakBook(self._peaks_path()), key, outcome.gpu_peak, model):
            self._sink.notice("the cell's measured GPU peak is recorded: the next --estimate of it starts there")
        error = outcome.remote_error
        advice = oom_advice(error.ename if error else None, request.gpu_memory if request else None,
                            outcome.gpu_peak)
        if advice:
            self._sink.notice(advice)

    def _peaks_path(self) -> Path:
        root = default_state_dir()
        check_state_dir(root)
        return root / "gpu-peaks.json"

    def _name_ignored_options(self, request: OffloadRequest) -> None:
        ignored = ignored_locally(request, self.default_gpu_model)
        if ignored:
            self._sink.notice(
                f"the local backend ignores {', '.join(ignored)}: they choose where a cluster runs the cell"
            )

    def _cell_number(self) -> int:
        """The running cell's ``In[N]``: IPython 9 already counts the next cell while one runs, 8 only after."""
        running = getattr(self.ipython.displayhook, "exec_result", None)
        number = getattr(running, "execution_count", None)
        return number if isinstance(number, int) else int(self.ipython.execution_count)

    def _request(self, line: str, cell: str) -> OffloadRequest:
        args = self._parsed.get(line)
        if args is None:
            try:
                args = parse_argstring(self.gpu_offload_cell, line)
            except UsageError as err:
                raise OffloadUsageError(_explain(str(err), line)) from None
            # a notebook repeats the same few magic lines; argparse costs a third of a warm cell's CPU
            if len(self._parsed) < 256:
                self._parsed[line] = args
        return parsed_request(
            args, cell, gpus=self.default_gpus, gpu_model=self.default_gpu_model, cluster=self.default_cluster,
            trusted_only=self.trusted_only, inputs=split_names(args.inputs), outputs=split_names(args.outputs),
            session=args.session, noblock=args.noblock, estimate=args.estimate, out_rank=args.out_rank,
            idle_timeout=None if args.idle_timeout is None else args.idle_timeout * 60,
        )

    def _backend(self, name: str | None) -> Backend:
        name = name or self.backend
        if name == "auto":
            name = registry.auto_name(os.environ)
            if name == "local" and not self._announced:
                self._announced = True
                self._sink.notice(LOCAL_NOTE)
        if name not in self._backends:
            factory = self._factories.get(name)
            if factory is None:
                raise BackendNotConfigured(
                    f"backend `{name}` (from c.GpuOffloadMagics.backend or %gpu_offload config) is not one "
                    f"this kernel knows: set it to auto, local or {', '.join(n for n in self._factories if n != 'local')}."
                )
            self._backends[name] = factory()
        return self._backends[name]

    def started_backends(self) -> list[Backend]:
        """The backends this kernel has started so far."""
        return list(self._backends.values())

    def cluster_backend(self) -> Backend:
        """This kernel's kubernetes backend, started on first use as a cell would start it (the panel reads
        donors and the user's runs through it: one cluster client per kernel). Raises
        ``BackendNotConfigured`` naming what is missing."""
        return self._backend("kubernetes")

    # -- line magics ----------------------------------------------------------------------------------

    @_named(line_magic, "gpu_offload")
    def gpu_offload_line(self, line: str) -> None:
        """Show or manage offloading: ``status`` (default), ``sessions``, ``close NAME|--all``, ``config``,
        ``panel`` (a live panel of clusters and runs), ``clusters`` (peered clusters and their GPUs), ``cleanup
        [--all]`` (delete runner pods this kernel, or every kernel of yours, left on the cluster), ``checkpoint
        SESSION``, ``restore NAME [--session S]`` and ``move SESSION`` (see :mod:`.session_commands`).

        ``config KEY=VALUE`` sets a setting for this kernel (backend, default_gpus, default_cluster,
        default_gpu_model, trusted_only, progress_after, grace_period).
        """
        words = shlex.split(line)
        command, rest = (words[0], words[1:]) if words else ("status", [])
        actions: dict[str, Callable[[list[str]], None]] = {
            "status": self._status,
            "sessions": self._list_sessions,
            "close": self._close,
            "config": self._config,
            "panel": self._panel,
            "clusters": self._clusters,
            "cleanup": self._cleanup,
            "checkpoint": lambda words: print(session_commands.checkpoint(self._backends.values(), words)),
            "restore": lambda words: print(session_commands.restore(self._backends.values(), words)),
            "move": lambda words: print(*session_commands.move(self._backends.values(), words,
                                                               self.grace_period), sep="\n"),
        }
        action = actions.get(command)
        if action is None:
            raise OffloadUsageError(
                f"%gpu_offload {command}: unknown command. Write one of: %gpu_offload status, "
                "%gpu_offload sessions, %gpu_offload close NAME, %gpu_offload config [KEY=VALUE], %gpu_offload panel, "
                "%gpu_offload clusters, %gpu_offload cleanup [--all], "
                f"{session_commands.USAGE}."
            )
        action(rest)

    @_named(line_magic, "gpu_result")
    def gpu_result(self, line: str) -> None:
        """Wait for the last ``--noblock`` run, show its output and copy its variables back."""
        if self.last_handle is None:
            raise OffloadUsageError(
                "%gpu_result: there is no --noblock run in this kernel. Start one with "
                "%%gpu_offload --noblock on top of a cell."
            )
        values = self.last_handle.result()
        if values:
            self._sink.notice(f"copied back: {', '.join(values)}")

    def _status(self, words: list[str]) -> None:
        if words == ["--timing"]:
            print(describe_timing(self.last_outcome.timing if self.last_outcome is not None else None))
            return
        if words:
            raise OffloadUsageError(f"%gpu_offload status {' '.join(words)}: write %gpu_offload status, or "
                                    "%gpu_offload status --timing for where the last run's wait went.")
        print(f"default backend: {self.backend}")
        for backend in self._backends.values():
            print(backend.describe())
        self._list_sessions([])
        if self.last_outcome is not None:
            print(describe(self.last_outcome))
        handle = self.last_handle
        if handle is not None:
            progress = handle.progress
            print(f"last --noblock run: {handle.status}" + (f" ({progress})" if progress else ""))

    def _list_sessions(self, _: list[str]) -> None:
        found = [info for backend in self._backends.values() for info in backend.sessions()]
        if not found:
            print("no sessions (start one with %%gpu_offload --session NAME)")
        for info in found:
            release = f"; {info.release}" if info.release else ""
            print(
                f"session {info.name}: {info.where}, {info.runs} cell(s) run, {'busy' if info.busy else 'idle'}"
                f"{release}"
            )

    def _close(self, words: list[str]) -> None:
        if not words:
            raise OffloadUsageError(
                "%gpu_offload close: name the session, e.g. %gpu_offload close train, or --all."
            )
        for backend in self._backends.values():
            names = [s.name for s in backend.sessions()] if words == ["--all"] else words
            for name in names:
                if backend.close_session(name, self.grace_period):
                    print(f"closed session {name}")
                    words = [w for w in words if w != name]
        unknown = [w for w in words if w != "--all"]
        if unknown:
            raise OffloadUsageError(
                f"%gpu_offload close {' '.join(unknown)}: no such session. `%gpu_offload sessions` lists them."
            )

    def _config(self, words: list[str]) -> None:
        traits = ("backend", "default_gpus", "default_cluster", "default_gpu_model", "trusted_only",
                  "progress_after", "grace_period")
        for word in words:
            key, sep, value = word.partition("=")
            if not sep or key not in traits:
                raise OffloadUsageError(
                    f"%gpu_offload config {word}: write KEY=VALUE with KEY one of {', '.join(traits)}, "
                    "e.g. %gpu_offload config default_gpus=2."
                )
            trait = self.traits()[key]
            try:
                setattr(self, key, trait.from_string(value))
            except Exception as exc:
                raise OffloadUsageError(f"%gpu_offload config {word}: {exc}") from None
        for key in traits:
            print(f"{key} = {getattr(self, key)!r}    # c.GpuOffloadMagics.{key}")

    def _kube(self) -> Any:
        return self.cluster_backend()  # builds it, or says what configuration is missing

    def _clusters(self, _: list[str]) -> None:
        from IPython.display import display

        from .cluster_commands import clusters

        display(clusters(self._kube()))

    def _cleanup(self, words: list[str]) -> None:
        from .cluster_commands import cleanup

        print(cleanup(self._kube(), everything_of_user=words == ["--all"]))

    def _panel(self, _: list[str]) -> None:
        from .dashboard import panel

        self.last_panel = panel(self.ipython)

    def close(self) -> None:
        """End every session (the kernel is shutting down)."""
        for backend in self._backends.values():
            backend.close()


def _explain(message: str, line: str) -> str:
    """Turn argparse's complaint into one that says what to write instead."""
    hints = []
    for word in line.split():
        if word.startswith("--") and word.split("=")[0] not in OPTIONS:
            close = difflib.get_close_matches(word.split("=")[0], OPTIONS, n=1)
            hints.append(f"`{word}` is not an option" + (f" (did you mean {close[0]}?)" if close else ""))
    detail = "; ".join(hints) or message
    return (
        f"%%gpu_offload {line.strip()}: {detail}. Options: {USAGE} (see %%gpu_offload? for help)."
    )
