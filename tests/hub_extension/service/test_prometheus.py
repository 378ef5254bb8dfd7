"""A real Prometheus (Debian's package; tests/run.sh installs it) scrapes the service through the hub's proxy with
a read:metrics token, as a platform team's would, while runs of known length finish on the sandbox; PromQL then
gives each user's and each donor's GPU-seconds and cost as the usage API records them."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from gpu_offload.sandbox.fixtures import stop_process, wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..conftest import ARTIFACTS, TESTER_TOKEN, free_port, http, offloaded_namespace

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RUNS = (("pat", 1, 2), ("quinn", 2, 3))
"""(user, GPUs, seconds): two users, runs of known length."""


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.fixture()
def prometheus(hub: Any, tmp_path: Path) -> Iterator[str]:
    assert Path(PROMETHEUS).exists(), "prometheus missing: tests/run.sh installs Debian's prometheus package"
    minted = http("POST", f"{hub.url}hub/api/users/admin/tokens", TESTER_TOKEN,
                  {"note": "prometheus", "expires_in": 3600, "scopes": ["read:metrics"]})
    assert minted.status == 201, minted.text
    target = urllib.parse.urlsplit(hub.service_url)
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{
                  "job_name": "gpu-offload", "metrics_path": f"{target.path}metrics",
                  "authorization": {"credentials": minted.json()["token"]},
                  "static_configs": [{"targets": [target.netloc]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"
    try:
        def scraping() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                return any(r["value"][1] == "1" for r in _query(base, 'up{job="gpu-offload"}'))
            except OSError:
                return False

        wait_until(scraping, "Prometheus scraping the service", timeout=120, every=0.5)
        yield base
    finally:
        stop_process(proc)
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / "prometheus.log", ARTIFACTS / "prometheus.log")


def _pod(name: str, user: str, gpus: int, seconds: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"gpu-offload.io/managed-by": "gpu-offload",
                                                  "gpu-offload.io/user": user},
                         "annotations": {"gpu-offload.io/user": user}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "runner", "image": "python:3.11",
                "command": ["python3", "-c", f"import time; time.sleep({seconds})"],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_promql_gives_gpu_seconds_per_user_and_donor_as_the_usage_api_records_them(
        hub: Any, origin: RunningOrigin, prometheus: str) -> None:
    client = origin.sandbox.api_client()
    core = kubernetes.client.CoreV1Api(client)
    ns = offloaded_namespace(client)
    try:
        for i, (user, gpus, seconds) in enumerate(RUNS):
            core.create_namespaced_pod(ns, _pod(f"gpuo-prom{i}", user, gpus, seconds))

        def recorded() -> dict[str, dict[str, Any]] | None:
            usage = hub.api("GET", "api/admin/usage", "vera").json()["usage"]
            mine = {u["user"]: u for u in usage if u["user"] in {r[0] for r in RUNS}}
            return mine if len(mine) == len(RUNS) else None

        usage = wait_until(recorded, "both runs recorded by the service", timeout=120)
        expected = {user: usage[user]["gpu_hours"] * 3600 for user, _, _ in RUNS}
        # GPUs times the run's time as the origin saw it (issue 20 item 5: from the first Running the meter
        # saw, a watch event after the container started, to the end it saw): the sleep, less up to a second
        for user, gpus, seconds in RUNS:
            assert gpus * (seconds - 1) <= expected[user] <= gpus * (seconds + 60), (user, usage[user])

        promql = 'sum by (user, cluster) (gpu_offload_gpu_seconds_total{user=~"pat|quinn"})'

        def scraped() -> dict[tuple[str, str], float] | None:
            rows = {(r["metric"]["user"], r["metric"]["cluster"]): float(r["value"][1])
                    for r in _query(prometheus, promql)}
            return rows if len(rows) == len(RUNS) else None

        by_user = wait_until(scraped, "Prometheus to have scraped both runs", timeout=60)
        assert by_user == pytest.approx({(u, usage[u]["cluster_id"]): expected[u] for u, _, _ in RUNS}, abs=0.01)
        # per donor: the same GPU-seconds summed over its users
        donors: dict[str, float] = {}
        for (_, cluster), value in by_user.items():
            donors[cluster] = donors.get(cluster, 0.0) + value
        per_donor = {r["metric"]["cluster"]: float(r["value"][1]) for r in _query(
            prometheus, 'sum by (cluster) (gpu_offload_gpu_seconds_total{user=~"pat|quinn"})')}
        assert per_donor == pytest.approx(donors, abs=0.01)
        # cost per user and donor: what each run was priced at when recorded, as the usage API says
        cost = {(r["metric"]["user"], r["metric"]["cluster"]): float(r["value"][1]) for r in _query(
            prometheus, 'sum by (user, cluster) (gpu_offload_cost_total{user=~"pat|quinn"})')}
        assert cost == pytest.approx({(u, usage[u]["cluster_id"]): usage[u]["cost"] for u, _, _ in RUNS}, abs=1e-6)
        # both runs were bound without a queue: each one placement observation, none for the queue
        placed = _query(prometheus, "sum(gpu_offload_placement_seconds_count)")
        assert placed and float(placed[0]["value"][1]) >= len(RUNS)
    finally:
        core.delete_namespace(ns)
        client.close()
