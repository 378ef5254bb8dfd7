"""Settings every test session shares, and the two lanes.

Lanes: a test is in the end-to-end lane (marker ``e2e``) when it uses a fixture that starts a sandbox, a
kernel, a hub, a browser or a process (:data:`E2E_FIXTURES`, marked automatically) or is marked ``e2e``
itself; every other test is in the fast lane (marker ``fast``): ``pytest -m fast`` or
``bash tests/run.sh --fast``. A guard fails any fast-lane test that starts a process or a sandbox API server,
so a test in the wrong lane shows the first time it runs, in either lane.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import api_client, origin_pool
from xdist.scheduler import LoadScopeScheduling

pytest_plugins = ["pytester"]  # tests/test_lanes.py runs pytest on test files it writes

# Runs started by tests record themselves for the notebook panel; keep those records out of the real
# Jupyter runtime directory. Set at import so kernels and servers started by any fixture inherit it;
# tests that need their own directory still set theirs.
_STATE_DIR = tempfile.mkdtemp(prefix="gpu-offload-test-runs-")
os.environ.setdefault("GPU_OFFLOAD_STATE_DIR", _STATE_DIR)
# Donors stay untrusted unless a test says otherwise: the developer's own setting must not leak in.
os.environ.pop("GPU_OFFLOAD_TRUSTED_CLUSTERS", None)
# The Ctrl-C tests send SIGINT as a terminal does, to processes that must have a terminal's default for it. A
# suite started in the background of a non-interactive shell (`.ci/run > log &`, nohup) inherits SIGINT and
# SIGQUIT ignored, an ignored signal stays ignored across exec, and every process the tests start would then
# ignore Ctrl-C. Back to the defaults before any fixture starts anything (xdist workers import this too).
for _signum, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_signum) == signal.SIG_IGN:
        signal.signal(_signum, _handler)

E2E_FIXTURES = frozenset({
    # a sandbox (an API server, with or without the Liqo origin and its kubelet's container processes)
    "origin", "api_sandbox", "sandbox", "server", "queued_client",
    # kernels, hubs, browsers, Metaflow, the runner and other servers as processes
    "kernel", "kernels", "hub", "hub_factory", "queued_hub", "peering_hub", "browser", "lab", "service",
    "prometheus", "run_flow", "offload_deployment", "s3_server", "s3_endpoint", "session", "python", "wheel",
    "z2jh",
    # a child process that decodes a donor's bytes (tests/engine/trust/isolated.py)
    "decode_child",
})
"""Fixtures that start a sandbox, a kernel, a hub, a browser or a process: a test using one (directly or
through another fixture) is in the end-to-end lane."""

SANDBOX_START = "gpu_offload.sandbox.start"  # audited by the sandbox's API server as it starts
ORIGIN_START = "gpu_offload.sandbox.origin"  # audited by running_origin: a Liqo origin (API server, kubelet, donors)
_SPAWNS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                     "os.exec", SANDBOX_START})


class FastLaneViolation(RuntimeError):
    """A fast-lane test started a process or a sandbox."""


class _Guard:
    """What the audit hook needs: which fast test is running and which threads were there before it."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.background: frozenset[threading.Thread] = frozenset()
        self.violations: list[str] = []
        self.sandbox_starts = 0
        self.origins: list[str] = []
        """Each origin started in this process: the test that started it, and its configuration."""

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event not in _SPAWNS:  # called for every audited event in the process: stay cheap
            if event == ORIGIN_START:  # its API server's start is the event the guard refuses
                test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test").rsplit(" (", 1)[0]
                self.origins.append(f"{args[1] if len(args) > 1 else '?'}  <- {test}")
            return
        if event == SANDBOX_START:
            self.sandbox_starts += 1
        thread = threading.current_thread()
        # Threads alive before the test (a session fixture's server, an earlier test's pool) are not its own.
        if self.test is None or thread in self.background:
            return
        what = "started a sandbox API server" if event == SANDBOX_START else f"started a process ({event} {args[:2]!r})"
        self.violations.append(what)
        raise FastLaneViolation(
            f"{self.test} is in the fast lane but {what}: mark it pytest.mark.e2e (or use a fixture of "
            f"tests/conftest.py's E2E_FIXTURES), or keep it in-process")

    def watch(self, nodeid: str) -> None:
        self.test, self.violations = nodeid, []
        self.background = frozenset(t for t in threading.enumerate() if t is not threading.main_thread())

    def release(self) -> list[str]:
        self.test, self.background = None, frozenset()
        return self.violations


_GUARD = _Guard()
sys.addaudithook(_GUARD.audit)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end lane: starts a sandbox, kernel, hub, browser or process "
                                       "(set automatically from the fixtures a test uses)")
    config.addinivalue_line("markers", "fast: fast lane: pure and in-process (set on every test not marked e2e)")
    if not hasattr(config, "workerinput"):
        config.stash[_GROUPS_FILE] = str(Path(tempfile.mkdtemp(prefix="gpu-offload-groups-")) / "groups.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS_FILE in config.stash:
        shutil.rmtree(Path(config.stash[_GROUPS_FILE]).parent, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slowest-file", default=None,
                     help="write the slowest 50 tests (setup, call and teardown summed) to this file")
    parser.addoption("--max-origins", type=int, default=None,
                     help="fail the session when it started this many sandbox origins or more (all workers)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is None and E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.fast)


GROUPS_KEY = "gpu_offload_groups"  # workerinput: the file a worker writes each test's group to


class GroupScheduling(LoadScopeScheduling):
    """``--dist loadgroup`` for this suite: whole groups (:func:`worker_group`) go to one worker.

    xdist's own loadgroup appends ``@group`` to ``item._nodeid``, which pytest 9 no longer reads (its node ids
    are structured), so the groups are silently dropped (pytest-xdist issue 1386). Here the workers write each
    test's group to a file during collection, and the scheduler, which starts only once every worker has
    collected, reads it."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._file = Path(config.stash[_GROUPS_FILE])
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = json.loads(self._file.read_text()) if self._file.exists() else {}
        return self._groups.get(nodeid) or nodeid.split("::", 1)[0]


_GROUPS_FILE = pytest.StashKey[str]()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    return GroupScheduling(config, log)


def pytest_configure_node(node: Any) -> None:  # xdist, in the controller: where a worker writes its groups
    node.workerinput[GROUPS_KEY] = node.config.stash[_GROUPS_FILE]


# tryfirst: before xdist's own hook tells the controller this worker has collected. The controller schedules as
# soon as every worker has told it, and reads this file then: written after (trylast, as before), a loaded machine
# let the controller find no file, every test fall back to its module's group, and each worker start its own
# origin of a shared configuration. Deselection is over by now (pytest_collection_modifyitems): these are the
# tests this worker runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    target = getattr(session.config, "workerinput", {}).get(GROUPS_KEY)
    if target:
        groups = {item.nodeid: worker_group(item) for item in session.items}
        partial = Path(f"{target}.{os.getpid()}")
        partial.write_text(json.dumps(groups))
        partial.replace(target)  # both workers collect the same tests: either whole file will do


def worker_group(item: pytest.Item) -> str:
    """What ``--dist loadgroup`` (:class:`GroupScheduling`) keeps on one xdist worker: every test of one shared origin configuration
    (the pool then starts it once in the whole run, not once per worker), otherwise the test's module (its
    module-scoped fixtures are built once, as with ``--dist loadscope``)."""
    info = getattr(item, "_fixtureinfo", None)
    key = None
    # ``origin``, or another fixture marked with ``pooled_as`` (the queued flows' ``kueue_origin``)
    for name in ("origin", *sorted(info.name2fixturedefs if info is not None else ())):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        for definition in reversed(defs or ()):
            key = getattr(definition.func, "origin_key", None)
            # a module's own ``origin`` that takes its conftest's (to add a real-cluster half, test_cells.py) still
            # serves that pooled origin on the sandbox; one that does not is an origin of its own
            if key is not None or name not in definition.argnames:
                break
        if key is not None or name == "origin" and defs:
            break
    if key is not None:
        return "origin-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return item.nodeid.split("::", 1)[0]


def _guarded(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("e2e") is not None:
        return (yield)
    _GUARD.watch(item.nodeid)
    try:
        result = yield
    finally:
        violations = _GUARD.release()
    if violations:  # the code under test may have swallowed the exception: fail the test anyway
        pytest.fail(f"{item.nodeid} is in the fast lane but {violations[0]}: mark it pytest.mark.e2e")
    return result


# Setup and call only: teardown also runs the finalizers of wider-scoped fixtures of earlier tests.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _guarded(item))


class _Durations:
    """Each test's setup, call and teardown time, and the sandbox and origin start-ups of the session (all
    workers)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.sandbox_starts = 0
        self.origins: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_testnodedown(self, node: Any, error: Any) -> None:  # xdist: a worker's own count
        output = getattr(node, "workeroutput", {})
        self.sandbox_starts += output.get("sandbox_starts", 0)
        self.origins += output.get("origins", [])

    def starts(self) -> tuple[int, int]:
        """Sandbox API servers and origins started by the whole session (this process and its workers)."""
        return self.sandbox_starts + _GUARD.sandbox_starts, len(self.all_origins())

    def all_origins(self) -> list[str]:
        """Each origin the session started: its configuration and the test that started it."""
        return sorted(self.origins + _GUARD.origins)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        session.config.pluginmanager.register(_Durations(), "gpu-offload-durations")


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):
        config.workeroutput["sandbox_starts"] = _GUARD.sandbox_starts
        config.workeroutput["origins"] = _GUARD.origins
        return
    durations = config.pluginmanager.get_plugin("gpu-offload-durations")
    limit = config.getoption("--max-origins")
    if durations is not None and limit is not None and durations.starts()[1] >= limit:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # reported in the terminal summary
    target = config.getoption("--slowest-file")
    if durations is None or not target:
        return
    slowest = sorted(durations.seconds.items(), key=lambda kv: -kv[1])[:50]
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text("".join(f"{seconds:8.2f}s  {nodeid}\n" for nodeid, seconds in slowest))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    durations = config.pluginmanager.get_plugin("gpu-offload-durations")
    if durations is None:
        return
    sandboxes, origins = durations.starts()
    terminalreporter.write_line(f"sandbox API servers started in this session: {sandboxes}, of them origins: {origins}")
    for line in durations.all_origins():  # by configuration: the same configuration twice is a fold missed
        terminalreporter.write_line(f"  origin: {line}")
    limit = config.getoption("--max-origins")
    if limit is not None and origins >= limit:
        terminalreporter.write_line(
            f"FAILED: {origins} sandbox origins started, the limit is fewer than {limit}: share one through "
            "origin_fixture (tests/conftest.py keeps a configuration's tests on one worker) instead of starting "
            "a module's own", red=True)


# origin_pool: the session's sandbox origins by configuration, for every origin_fixture; api_client: an official
# client of the `origin` a test's module or conftest defines (every level's tests use this one)
__all__ = ["api_client", "origin_pool"]


@pytest.fixture(scope="session", autouse=True)
def _remove_run_records() -> Iterator[None]:
    yield
    shutil.rmtree(_STATE_DIR, ignore_errors=True)
