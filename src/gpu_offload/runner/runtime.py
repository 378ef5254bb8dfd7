"""The runner process's plumbing: private frame channel, capture, signals, watchdog, and one run.

Set up once per process (:meth:`Runtime.start`); :meth:`Runtime.run` executes one bundle and always ends
with a ``done`` frame, whatever the cell did.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import display, gpu_cap, handover, ipython_hook, ipython_shim, metrics, watchdog
from .capture import FdCapture, private_stdout, write_all
from .execute import cell_traceback, run_cell
from .failures import CellFailed
from .runlog import RunLog
from .signals import Interrupts, masked
from .ticker import Ticker
from .wire import MAX_FRAME_BYTES, RELAY_ROOM, FrameEncoder

# frames that must come after the text printed before them: the capture is drained first
_ORDERED = {"display_data", "error", "warning", "outputs", "done"}
STATUS_EXIT = {"ok": 0, "error": 1, "interrupted": 130}
MISMATCH_EXIT = 3


def _frame_writer(fd: int) -> Any:
    main = threading.main_thread()

    def write(data: bytes) -> None:
        try:
            if threading.current_thread() is main:
                with masked():  # an interrupt must not cut a frame line in half
                    write_all(fd, data)
            else:
                write_all(fd, data)
        except BrokenPipeError:
            os._exit(141)  # the engine is gone: nobody is left to report to

    return write


def process_age() -> float | None:
    """Seconds since this process started (the kernel's clock, so its exec and the interpreter's start
    count), ``None`` where /proc cannot tell."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            # fields after the command name, which is in parentheses and may hold spaces
            rest = stat.read().rsplit(b")", 1)[1].split()
        started = int(rest[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, in ticks since boot
        return round(max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started), 4)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def new_namespace() -> dict[str, Any]:
    """The cell's globals: a fresh ``__main__`` (so notebook-style functions pickle by value)."""
    return {"__name__": "__main__", "__builtins__": builtins, "display": display.display}


_PREPARED: list[bool] = []


def prepare_imports() -> None:
    """What the cell's imports find in this process: its environment and import hooks. Once per process, before
    anything is imported for a cell (the pre-import's thread starts after it: nothing here changes the
    environment while a module may be reading it)."""
    if _PREPARED:
        return
    _PREPARED.append(True)
    gpu_cap.install()  # before any cell: MPS reads its limit when the process creates its CUDA context
    # not setdefault: a kernel's environment names matplotlib_inline, which needs a live IPython;
    # a bundle's own env (applied per run) can still choose another backend
    os.environ["MPLBACKEND"] = f"module://{__package__}.mpl_backend"
    ipython_hook.install()
    ipython_shim.install()  # where IPython is missing: its display helpers for notebook cells


class Runtime:
    """One runner process: frames out, streams captured, interrupts routed to the cell."""

    def __init__(self, nonce: str, session: bool, rank: int | None = None) -> None:
        self.session = session
        self.rank = rank
        """This process's rank in a distributed run (``None``: not one)."""
        self.interrupts = Interrupts(one_shot=not session)
        self.command_fd = os.dup(0)  # the session's command channel; the cell's stdin is /dev/null
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.close(devnull)
        # a rank's frames pass through its node's launcher, which writes a longer seq in front of them
        limit = MAX_FRAME_BYTES if rank is None else MAX_FRAME_BYTES - RELAY_ROOM
        self.encoder = FrameEncoder(nonce, _frame_writer(private_stdout()), limit=limit, rank=rank or 0)
        self.log = RunLog()
        self.capture = FdCapture(self._stream)
        self.sampler = metrics.Sampler(self.encoder.emit)
        self.ticker = Ticker()
        """The one thread of a run's periodic work: the metrics sampler's and the GPU memory watch's."""
        self.gpu_watch: Any = None
        """``gpu_watch.Watch`` once a run holds part of a GPU (imported then: most runners never need it)."""
        self.namespace = new_namespace()
        self.term_checkpoint: dict[str, Any] | None = None
        """A session's checkpoint armed for SIGTERM (:func:`.session_state.arm`)."""
        self.preimport: Any = None
        """A one-shot runner's ``preimport.Preimport`` (``--preimport``): the run waits for it first."""
        if session:  # a one-shot runner gets SIGTERM from the kernel's own Ctrl-C too (its pod deleted with a grace)
            self.interrupts.on_terminate = self._stopping

    def _stopping(self) -> None:
        """SIGTERM stopped a session's running cell (its pod is being deleted: a preemption, a drain, an eviction;
        the kernel interrupts a session's cell with the ``interrupt`` command, never so): the cell is told at once,
        and whether the session's state is being checkpointed now."""
        self.encoder.emit("stopping", signal="SIGTERM", session=True, checkpoint=self.term_checkpoint is not None)

    def emit(self, kind: str, **payload: Any) -> None:
        """Send a frame, after any text the cell printed before it."""
        if kind in _ORDERED:
            self.capture.flush()
        self.log.frame(kind, payload)
        if kind == "outputs":
            # the engine concludes a run only at its `done`: the outputs and whatever follows go with it in one
            # write, one wake-up of the engine instead of two
            self.encoder.hold()
        self.encoder.emit(kind, **payload)
        if kind == "done":
            self.encoder.release()

    def _stream(self, name: str, text: str) -> None:
        self.log.add(text)
        self.encoder.emit("stream", name=name, text=text)

    def start(self, parent_pid: int | None) -> None:
        """Say hello, install handlers and the watchdog, and start capturing fds 1 and 2."""
        self.interrupts.install()
        prepare_imports()
        if parent_pid is not None:
            watchdog.arm(parent_pid, self._parent_died)
        python = ".".join(str(part) for part in sys.version_info[:3])
        self.encoder.emit(
            "hello", python=python, pid=os.getpid(), gpus=metrics.gpu_names(), session=self.session,
            boot=process_age(),
        )
        display.set_emitter(self.emit)
        self.capture.start()

    def _parent_died(self) -> None:
        self.interrupts.terminating = True
        self.interrupts.terminate()
        watchdog.hard_exit_later(1)

    def version_mismatch(self, wanted: str, run_id: str) -> bool:
        """Send the one-sentence error if this Python's minor version is not ``wanted``."""
        ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if wanted == ours:
            return False
        self.encoder.begin_run(run_id)
        self.encoder.emit(
            "error",
            ename="PythonVersionMismatch",
            evalue=(
                f"The runner has Python {sys.version.split()[0]} but the notebook kernel runs Python "
                f"{wanted}, and variables cannot travel between minor versions: choose an image with "
                f"Python {wanted} (--image)."
            ),
            traceback=[],
        )
        self.encoder.emit("done", status="error", elapsed=0.0)
        return True

    def run(self, bundle: dict[str, Any]) -> str:
        """Run one bundle; returns the ``done`` status (``ok``, ``error`` or ``interrupted``)."""
        started = time.perf_counter()
        self.encoder.begin_run(bundle["run_id"])
        self.log.begin(bundle["log_url"])
        status = "ok"
        try:
            try:
                self.interrupts.begin()
                waited = self._settle_preimport()
                # after the pre-import: the environment does not change while a module may read it
                os.environ.update({str(k): str(v) for k, v in bundle["env"].items()})
                self.ticker.start(bundle["metrics_interval"], (self.sampler.task(), self._gpu_memory_watch()))
                run_cell(self.emit, self._own_share(bundle), self.namespace, shared_inputs=self.rank is not None,
                         imported=waited)
            finally:
                self.interrupts.running = False
                self.ticker.stop()
                handover.release()
        except KeyboardInterrupt as exc:
            tb = cell_traceback(exc, bundle["filename"])
            if self.gpu_watch is not None and self.gpu_watch.stopped:  # the runner stopped it: past its part
                status = "error"
                self.emit("error", ename=self.gpu_watch.NAME, evalue=self.gpu_watch.stopped, traceback=tb)
            else:
                status = "interrupted"
                self.emit("error", ename="KeyboardInterrupt", evalue="interrupted", traceback=tb)
        except CellFailed:
            status = "error"
        except Exception as exc:  # a fault of the runner itself, not of the cell: still report and go on
            import traceback

            status = "error"
            self.emit(
                "error",
                ename=type(exc).__name__,
                evalue=f"the runner failed: {exc}",
                traceback=traceback.format_exception(type(exc), exc, exc.__traceback__),
            )
        self.capture.flush()
        # before `done`: whoever follows the run deletes the pod once it has seen that frame
        problem = self.log.upload()
        if problem:
            self.emit("warning", text=problem)
        peak = gpu_cap.measured_peak()
        self.emit("done", status=status, elapsed=round(time.perf_counter() - started, 6),
                  **({"gpu_peak": peak} if peak is not None else {}))
        self.encoder.end_run()
        return status

    def _settle_preimport(self) -> float:
        """Wait for the modules imported while the bundle was on its way; the seconds waited."""
        if self.preimport is None:
            return 0.0
        if self.preimport.running:
            self.emit("status", state="importing modules")
        waited: float = self.preimport.settle()
        self.preimport = None
        return waited

    def _gpu_memory_watch(self) -> Callable[[], None] | None:
        """The ticker's watch of the GPU memory this run holds when it holds part of a GPU (``gpu_watch``)."""
        if self.gpu_watch is None and gpu_cap.holds_part(os.environ):
            from . import gpu_watch

            self.gpu_watch = gpu_watch.Watch(self.interrupts.interrupt)
        return None if self.gpu_watch is None else self.gpu_watch.task()

    def _own_share(self, bundle: dict[str, Any]) -> dict[str, Any]:
        """What this process sends back: everything outside a distributed run; in one, only the rank the
        variables come back from (``out_rank``) sends its outputs."""
        if self.rank is None or self.rank == bundle["ranks"]["out_rank"]:
            return bundle
        return {**bundle, "outputs": [], "required_outputs": []}

    def close(self) -> None:
        """Drain the capture and point fds 1 and 2 at /dev/null: late output (atexit) must not block."""
        self.capture.stop()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
