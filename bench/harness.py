"""What every benchmark shares: timing, percentiles, the machine line, a sandbox (in-process or as its own
process), an origin or a kernel to measure against, and one JSON result per run.

A benchmark builds a :class:`Run`, records figures into it and writes it::

    run = Run("placement", "Placement over 1,000 virtual nodes")
    wall, cpu = timed(lambda: place(inventory, request), repeat=200)
    run.figure("place most-free wall", wall, "ms")
    run.write()            # bench/results/placement/<UTC time>.json; prints the figures

``bench/report.py`` makes RESULTS.md from those files; ``bench/compare.py OLD NEW`` compares two of them.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import compare
from figure import KEPT_SAMPLES, Figure, kept_samples, percentile  # noqa: F401  (benchmarks and tests import these from here)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
SHARED = REPO.parent / "shared"
LIQO_CRDS = SHARED / "liqo-crds"


def machine() -> dict[str, Any]:
    """CPU model, cores, memory, kernel, Python and the load average now."""
    model = platform.machine()  # not platform.processor(): that runs uname
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
            "system": f"{platform.system()} {platform.release()} {platform.machine()}",
            "python": platform.python_version(), "load": [round(x, 1) for x in os.getloadavg()]}


def machine_line(facts: dict[str, Any] | None = None) -> str:
    """The one line every benchmark prints first, so figures from different runs can be compared."""
    m = facts or machine()
    load = ", ".join(f"{x:.1f}" for x in m["load"])
    return (f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['system']}, Python {m['python']}, "
            f"load average {load}")


def clock() -> float:
    """Seconds on the wall clock every benchmark times with (monotonic, high resolution): for a moment one
    thread records and another subtracts. Elapsed time from one point is a :class:`Stopwatch`."""
    return time.perf_counter()


class Stopwatch:
    """Time since it was started (or last restarted): wall, this process's CPU and the calling thread's CPU.

    ``clock = Stopwatch()`` ... ``clock.ms``. Wall time on a shared machine also counts other people's work;
    the CPU clocks count only ours (the thread's leaves out an in-process server's threads)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._wall, self._cpu, self._thread = time.perf_counter(), time.process_time(), time.thread_time()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._wall

    @property
    def ms(self) -> float:
        return self.seconds * 1000

    @property
    def cpu_ms(self) -> float:
        """This process's CPU (user + system, every thread) in milliseconds."""
        return (time.process_time() - self._cpu) * 1000

    @property
    def thread_cpu_ms(self) -> float:
        """The calling thread's CPU in milliseconds (call it from the thread that started the watch)."""
        return (time.thread_time() - self._thread) * 1000


def timed(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None
          ) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``repeat`` calls of ``fn`` (``before`` runs untimed ahead of each call).

    Both are kept: on a shared machine the wall time also counts other people's work, CPU time is this
    process's only. What ``fn`` returns is freed after the clocks stop, as real use frees it later."""
    wall, cpu = [], []
    for _ in range(repeat):
        if before is not None:
            before()
        watch = Stopwatch()
        kept = fn()
        cpu.append(watch.cpu_ms)
        wall.append(watch.ms)
        del kept
    return wall, cpu


def wall_ms(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall milliseconds of ``repeat`` calls of ``fn`` (:func:`timed` without the CPU)."""
    return timed(fn, repeat)[0]


@dataclass(frozen=True)
class ProcessRun:
    """A process run to completion: its wall and CPU seconds (user + system of it and its children) and result."""

    wall: float
    cpu: float
    done: subprocess.CompletedProcess[str]


def timed_process(argv: Sequence[str], **run: Any) -> ProcessRun:
    """Run ``argv`` to completion (``run``: keyword arguments of :func:`subprocess.run`; output captured as
    text unless given) and time it."""
    run = {"capture_output": True, "text": True, **run}
    before = _children_cpu()
    watch = Stopwatch()
    done = subprocess.run(list(argv), **run)
    return ProcessRun(watch.seconds, _children_cpu() - before, done)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    """One run of one benchmark: figures, notes, the machine, the date and the revision."""

    benchmark: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)
    started: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"))
    revision: str = field(default_factory=lambda: revision())
    script: str = ""
    """The script that ran, when its name is not ``bench/bench_<benchmark>.py`` (one script, two set-ups)."""

    def figure(self, name: str, samples: float | Sequence[float], unit: str, lower_is_better: bool = True
               ) -> Figure:
        """Record a figure (one value or the samples of repeated measurements) and return it."""
        values = (samples,) if isinstance(samples, (int, float)) else tuple(float(x) for x in samples)
        kept, measured = kept_samples(values)
        figure = Figure(name, unit, kept, lower_is_better, measured)
        self.figures.append(figure)
        return figure

    def note(self, text: str) -> None:
        """A line of context printed and kept with the figures (a goal met, a ratio, a caveat)."""
        self.notes.append(text)
        print(text)

    def goal(self, what: str, value: float, goal: float, unit: str = "ms") -> bool:
        """Note whether ``value`` (lower is better) meets ``goal``: ``worst render wall p95 1.20 ms: meets the
        5 ms goal``; returns whether it does."""
        meets = value <= goal
        self.note(f"{what} {value:.2f} {unit}: {'meets' if meets else 'misses'} the {goal:g} {unit} goal")
        return meets

    def source(self) -> str:
        return self.script or f"bench/bench_{self.benchmark}.py"

    def to_json(self) -> dict[str, Any]:
        return {"benchmark": self.benchmark, "script": self.source(), "title": self.title, "started": self.started,
                "revision": self.revision, "machine": self.machine, "notes": self.notes,
                "figures": [{**asdict(f), "samples": list(f.samples), "summary": f.summary()} for f in self.figures]}

    def table(self) -> str:
        """The figures as a Markdown table."""
        rows = ["| figure | unit | n | median | p95 | max |", "|---|---|---:|---:|---:|---:|"]
        for f in self.figures:
            s = f.summary()
            rows.append(f"| {f.name} | {f.unit} | {s['n']} | {s['median']:.4g} | {s['p95']:.4g} | {s['max']:.4g} |")
        return "\n".join(rows)

    def write(self, folder: Path = RESULTS) -> Path:
        """Print the table and write ``folder/<benchmark>/<start time>.json``, with every figure compared against
        the previous result in that folder (``bench/compare.py`` PREVIOUS THIS, printed too); returns the file."""
        print(machine_line(self.machine))
        print(self.table())
        target = folder / self.benchmark / f"{self.started.replace(':', '')}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        # the load now as well as at the start: compare.py judges no figure against a run on a machine far busier
        self.machine.setdefault("load_end", [round(x, 1) for x in os.getloadavg()])
        result = self.to_json()
        previous = previous_result(target)
        if previous is not None:
            result["previous"] = against(previous, result)
            print(f"against the previous result, {previous.name} (at {result['previous']['revision']}, load "
                  f"{result['previous']['load']}; this run's load {compare.run_load(result)}):")
            print("\n".join(result["previous"]["comparison"]))
        target.write_text(json.dumps(result, indent=1) + "\n")
        print(f"result: {target}")
        return target


def previous_result(target: Path) -> Path | None:
    """The newest result of the same benchmark written before ``target`` (file names are start times)."""
    earlier = sorted(p for p in target.parent.glob("*.json") if p.name < target.name)
    return earlier[-1] if earlier else None


def against(previous: Path, result: dict[str, Any]) -> dict[str, Any]:
    """``result``'s figures compared with ``previous``'s, as ``bench/compare.py`` judges them."""
    old = json.loads(previous.read_text())
    note = compare.caveat([old], [result])
    return {"file": previous.name, "revision": old["revision"], "load": compare.run_load(old),
            "comparison": [*([note] if note else []), *compare.compare([old], [result])]}


def revision() -> str:
    """The commit being measured, with ``+changes`` when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


@contextlib.contextmanager
def origin(donors: Any = 2, crds: Path | None = LIQO_CRDS, **options: Any) -> Iterator[Any]:
    """A sandbox origin with Liqo donors in a temporary folder (``donors``: a count or ``liqo.Donor`` list)."""
    from gpu_offload.sandbox.liqo.origin import running_origin

    with tempfile.TemporaryDirectory(prefix="bench-origin-") as tmp, \
            running_origin(Path(tmp), donors, crds=crds, **options) as running:
        yield running


@contextlib.contextmanager
def sandbox(crds: Path | Sequence[Path] | None = None, plugins: Sequence[Any] = ()) -> Iterator[Any]:
    """The bare sandbox API server (no Liqo) in a temporary folder."""
    from gpu_offload.sandbox.testing import running_sandbox

    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp, \
            running_sandbox(Path(tmp), crds=crds, plugins=plugins) as running:
        yield running


@contextlib.contextmanager
def kernel(setup: str = "", cwd: Path = REPO, env: dict[str, str] | None = None) -> Iterator[Any]:
    """A started Jupyter kernel's client (``setup`` executed first and required to succeed); shut down after."""
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(cwd), env={**os.environ, **(env or {})})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        if setup:
            reply = client.execute_interactive(setup, timeout=120)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"the benchmark kernel's setup failed: {reply['content']}")
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@contextlib.contextmanager
def sandbox_process(workdir: Path, *args: str, wait: float = 300.0) -> Iterator[Path]:
    """``gpu-offload sandbox ARGS`` as its own process (a separate server, as users run it), once its
    kubeconfig is written (it is written after the API answers); yields the kubeconfig. Its output goes to
    ``workdir/sandbox.log``. On exit: SIGTERM (the sandbox removes its pods), SIGKILL after 60 s."""
    kubeconfig = workdir / "kubeconfig"
    cli = Path(sys.executable).parent / "gpu-offload"
    with (workdir / "sandbox.log").open("wb") as log:
        proc = subprocess.Popen([str(cli), "sandbox", "--kubeconfig", str(kubeconfig), *args], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + wait
            while not kubeconfig.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the sandbox did not start within {wait:g} s; see {workdir / 'sandbox.log'}")
                time.sleep(0.2)
            yield kubeconfig
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
