"""Headroom of the hub service's JSON API through JupyterHub's proxy, with and without its fast paths.

Starts the sandbox origin with 10 Liqo donors, then a real JupyterHub (dummy authenticator) with the npm
configurable-http-proxy and the gpu-offload service as the hub runs it, and drives a fixed rate of GET
requests through the proxy at ``api/inventory`` and ``api/admin/clusters`` for a fixed time each, with a
hub API token of a ``bench`` service holding the view scope, after 5 s of the same, untimed. Open loop: request *i* is sent at
``start + i / rate`` whatever the earlier ones did, and its latency counts from that moment, so a stalled
service shows as latency, not as a lower rate. Goal (issue 17): 400 requests/s with p99 <= 50 ms for both.

Both variants run in one invocation, one after the other on the same origin: ``before``, the service as it
was at :data:`BEFORE` (bodies rebuilt per request, hub authentication through JupyterHub's blocking
one-thread pool, an info access-log line per request), run from that git revision in a temporary worktree
(the product keeps no switch back to it), and ``after``, the service of this checkout. Also printed: the
service process's CPU per variant and the machine's load average before and after (the machine is
shared). Run: ``.venv/bin/python bench/bench_headroom.py [--seconds 20] [--rates 200,400]
[--variants before,after]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml
from gpu_offload.hub_extension.service.local_hub import LocalHub, assign, config_text
from gpu_offload.sandbox.fixtures import stop_process, wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Run, clock, percentile
from harness import origin as origin_of  # bench/harness.py: the script's folder is on sys.path

REPO = Path(__file__).resolve().parents[1]
NODE_BIN = REPO / ".ci" / "node" / "node_modules" / ".bin"
DONORS, GOAL_RATE, GOAL_P99_MS = 10, 400, 50.0
WARM_SECONDS = 5.0
ENDPOINTS = ("api/inventory", "api/admin/clusters")
BENCH_TOKEN = "gpu-offload-bench-token-0123456789abcdef"
BEFORE = "dfbdf6e~1"
"""The revision just before the service's fast paths (kept bodies, then asynchronous hub authentication and
the debug access log): what ``before`` runs."""
VARIANTS = {"before": BEFORE, "after": None}
"""Variant -> the git revision its service runs from (None: this checkout)."""


@contextmanager
def service_code_at(revision: str, where: Path) -> Iterator[Path]:
    """``revision`` of this repository in a temporary worktree under ``where``; yields a folder that, first on
    PYTHONPATH, makes ``gpu_offload`` that revision's (its setup.py's folder map, as symlinks)."""
    tree, path = where / "tree", where / "path"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), revision], check=True,
                   capture_output=True)
    try:
        sys.path.insert(0, str(REPO / ".ci"))
        from layout import roots_of  # the same reading of setup.py's ROOTS as the type-check tree's

        for package, folder in roots_of(tree).items():
            if package == "gpu_offload":
                (path / package).mkdir(parents=True)
                for item in (tree / folder).iterdir():
                    (path / package / item.name).symlink_to(item)
            elif package.startswith("gpu_offload."):
                (path / "gpu_offload" / package.removeprefix("gpu_offload.")).symlink_to(tree / folder)
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Stack:
    """A running hub: where its proxy serves the service, and the service's and the proxy's process ids (for
    their CPU time)."""

    service_url: str
    service_pid: int
    proxy_pid: int


def write_hub(workdir: Path, origin: RunningOrigin, earlier: Path | None) -> tuple[Path, LocalHub]:
    """The hub's config file: the service against ``origin`` (``earlier``: the import folder of an earlier
    revision's service), and a ``bench`` service whose token may read."""
    chp = shutil.which("configurable-http-proxy") or str(NODE_BIN / "configurable-http-proxy")
    if not Path(chp).exists():
        raise SystemExit("configurable-http-proxy missing: tests/run.sh installs it into .ci/node")
    config = {"usageDatabase": {"url": f"sqlite:///{workdir}/usage.sqlite"},
              "liqo": {"tenantNamespaces": [f"liqo-tenant-donor-{i}" for i in range(1, DONORS + 1)]}}
    (workdir / "gpu-offload.yaml").write_text(yaml.safe_dump(config))
    environment = {"KUBECONFIG": str(origin.sandbox.kubeconfig), "GPU_OFFLOAD_CONFIG": str(workdir / "gpu-offload.yaml")}
    if earlier is not None:
        environment["PYTHONPATH"] = str(earlier)  # ahead of the installed package
    port, hub_port, proxy_api_port, service_port = (free_port() for _ in range(4))
    local = LocalHub(workdir, chp, port, hub_port, proxy_api_port, service_port, environment)
    extra = [] if earlier is None else [  # the earlier revision's service is a module, not a package
        f"c.JupyterHub.services[-1]['command'] = {[sys.executable, '-m', 'gpu_offload.hub_extension.service']!r}"]
    extra += [assign("JupyterHub.load_roles", [
        {"name": "bench", "scopes": ["custom:gpu-offload:view", "access:services!service=gpu-offload"],
         "services": ["bench"]}])]
    path = workdir / "jupyterhub_config.py"
    path.write_text(config_text(local, extra, services=[{"name": "bench", "api_token": BENCH_TOKEN}]))
    return path, local


def child_pid(hub_pid: int, marker: bytes) -> int:
    """The hub's child process whose command line holds ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == hub_pid and marker in cmdline:
            return int(entry.name)
    raise RuntimeError(f"the hub has no child process running {marker.decode()}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(url: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"token {BENCH_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except OSError:
        return 0


@contextmanager
def running_hub(workdir: Path, origin: RunningOrigin, earlier: Path | None) -> Iterator[Stack]:
    """JupyterHub, its proxy and the service, up until the block ends."""
    config, local = write_hub(workdir, origin, earlier)
    log = (workdir / "hub.log").open("wb")
    env = {**os.environ, "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=workdir, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    try:
        service_url = f"{local.url}services/gpu-offload/"

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterHub exited: {(workdir / 'hub.log').read_text()[-3000:]}")
            return all(get(f"{service_url}{e}") == 200 for e in ENDPOINTS)
        wait_until(ready, "JupyterHub and the gpu-offload service to answer", timeout=180, every=0.5)
        yield Stack(service_url, child_pid(proc.pid, b"gpu_offload.hub_extension.service"),
                    child_pid(proc.pid, b"configurable-http-proxy"))
    finally:
        stop_process(proc)
        log.close()


@dataclass(frozen=True)
class Figures:
    sent: int
    ok: int
    achieved_rate: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    service_cpu: float
    """Service CPU seconds per wall second during the run (1.0 = one core)."""
    service_cpu_ms: float
    """Service CPU milliseconds per answered request: what the load on the machine changes least."""
    proxy_cpu: float
    """configurable-http-proxy's CPU seconds per wall second."""
    late_p99_ms: float
    """How late this generator sent its requests (p99): above a few ms it, not the service, fell behind."""
    p99_from_send_ms: float
    """p99 latency counted from when each request was actually sent (the generator's own lag left out)."""


async def drive(url: str, rate: int, seconds: float, stack: Stack) -> Figures:
    """``rate`` GETs a second at ``url`` for ``seconds``, open loop; latency from each request's slot."""
    latencies: list[float] = []
    late: list[float] = []
    from_send: list[float] = []
    failures = 0
    headers = {"Authorization": f"token {BENCH_TOKEN}"}
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(slot: float) -> None:
            nonlocal failures
            sent = clock()
            late.append((sent - slot) * 1000)
            try:
                async with session.get(url, headers=headers) as answer:
                    await answer.read()
                    if answer.status != 200:
                        failures += 1
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                failures += 1
                return
            done = clock()
            latencies.append((done - slot) * 1000)
            from_send.append((done - sent) * 1000)

        for _ in range(20):  # warm the connection pool and the service's caches, untimed
            await one(clock())
        latencies.clear()
        late.clear()
        from_send.clear()
        failures = 0
        total = int(rate * seconds)
        tasks = []
        # the generator shares its process with the sandbox (a large heap): a full collection there would
        # stall the sending and count as the service's latency, so none runs while requests are timed
        gc.collect()
        gc.disable()
        cpu_before, proxy_before = cpu_seconds(stack.service_pid), cpu_seconds(stack.proxy_pid)
        start = clock()
        for i in range(total):
            slot = start + i / rate
            delay = slot - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(slot)))
        await asyncio.gather(*tasks)
        elapsed = clock() - start
        gc.enable()
        cpu = cpu_seconds(stack.service_pid) - cpu_before
        proxy = cpu_seconds(stack.proxy_pid) - proxy_before
    return Figures(total, len(latencies), len(latencies) / elapsed, percentile(latencies, 0.5),
                   percentile(latencies, 0.99), max(latencies, default=float("nan")), cpu / elapsed,
                   1000 * cpu / max(1, len(latencies)), proxy / elapsed, percentile(late, 0.99),
                   percentile(from_send, 0.99))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each timed run (default 20)")
    parser.add_argument("--rates", default="200,400", help="requests per second, comma-separated (default 200,400)")
    parser.add_argument("--variants", default="before,after",
                        help=f"before (the service at {BEFORE}), after (this checkout's), or both (default)")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"--variants {','.join(sorted(unknown))}: use before, after or both")
    run = Run("headroom", "Headroom of the JSON API through the proxy")
    run.note(f"{DONORS} donors, each run {args.seconds:g} s through configurable-http-proxy; goal {GOAL_RATE}/s with "
          f"p99 <= {GOAL_P99_MS:g} ms\n")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, origin_of(DONORS) as origin:
        for variant in variants:
            workdir = Path(tmp) / variant
            workdir.mkdir()
            revision = VARIANTS[variant]
            with contextlib.ExitStack() as code:
                earlier = None if revision is None else code.enter_context(service_code_at(revision, workdir / "code"))
                stack = code.enter_context(running_hub(workdir, origin, earlier))
                # untimed: the stack's first seconds (the hub's and the service's start-up work) are not the
                # steady state measured below
                asyncio.run(drive(f"{stack.service_url}{ENDPOINTS[0]}", rates[0], WARM_SECONDS, stack))
                for rate in rates:
                    for endpoint in ENDPOINTS:
                        figures = asyncio.run(drive(f"{stack.service_url}{endpoint}", rate, args.seconds, stack))
                        rows.append((variant, endpoint, rate, figures))
                        print(f"  {variant} {endpoint} {rate}/s: p99 {figures.p99_ms:.1f} ms", file=sys.stderr)
    print("| variant | endpoint | target /s | sent | ok | achieved /s | p50 ms | p99 ms | max ms | service CPU "
          "(cores) | service CPU ms/request | proxy CPU (cores) | sent late p99 ms | p99 from send ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for variant, endpoint, rate, f in rows:
        print(f"| {variant} | `{endpoint}` | {rate} | {f.sent} | {f.ok} | {f.achieved_rate:.0f} | {f.p50_ms:.1f} | "
              f"{f.p99_ms:.1f} | {f.max_ms:.1f} | {f.service_cpu:.2f} | {f.service_cpu_ms:.2f} | {f.proxy_cpu:.2f} | "
              f"{f.late_p99_ms:.1f} | {f.p99_from_send_ms:.1f} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    run.note(f"load average after: {load}")
    for variant, endpoint, rate, f in rows:
        run.figure(f"{variant} {endpoint} at {rate}/s: p99", f.p99_ms, "ms")
        run.figure(f"{variant} {endpoint} at {rate}/s: achieved", f.achieved_rate, "requests/s", lower_is_better=False)
        run.figure(f"{variant} {endpoint} at {rate}/s: service CPU per request", f.service_cpu_ms, "ms")
    goal = [(e, f) for v, e, r, f in rows if v == "after" and r == GOAL_RATE]
    for endpoint, f in goal:
        meets = f.ok == f.sent and f.p99_ms <= GOAL_P99_MS and f.achieved_rate >= 0.97 * GOAL_RATE
        run.note(f"after, {endpoint} at {GOAL_RATE}/s: p99 {f.p99_ms:.1f} ms, {'meets' if meets else 'MISSES'} the goal")
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
