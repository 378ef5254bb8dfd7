"""The panel rendered by JupyterLab in real Chromium, and the runs REST extension of the same server.

A screenshot goes to test-artifacts/magics/panel-jupyterlab.png."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from gpu_offload.sandbox.fixtures import stop_process

REPO = Path(__file__).resolve().parents[3]
ARTIFACTS = REPO / "test-artifacts" / "magics"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic", "--no-first-run",
        "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing: tests/run.sh installs it")


@dataclass(frozen=True)
class Lab:
    url: str
    token: str

    def api(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(f"{self.url}{path}", method=method, data=b"" if method == "POST" else None,
                                         headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _notebook(path: Path) -> None:
    cells = [
        "%load_ext gpu_offload.magics\n%gpu_offload config backend=local",
        "%%gpu_offload --gpus 0\nfor i in range(3):\n    print('step', i)",
        "%gpu_offload panel",
    ]
    spec = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells], metadata=spec)
    nbformat.write(notebook, path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """``jupyter lab`` on 127.0.0.1 with a token, a temporary root dir and the runs extension enabled."""
    root = tmp_path_factory.mktemp("lab-root")
    _notebook(root / "panel.ipynb")
    home = tmp_path_factory.mktemp("lab-home")
    env = {**os.environ, "GPU_OFFLOAD_STATE_DIR": str(home / "runs"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    for key in ("GPU_OFFLOAD_NAMESPACE", "GPU_OFFLOAD_SERVICE_URL", "GPU_OFFLOAD_BACKEND"):
        env.pop(key, None)
    port, token = _free_port(), secrets.token_hex(16)
    log = open(home / "lab.log", "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.jpserver_extensions={'gpu_offload.magics.runs_api': True}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    started = Lab(f"http://127.0.0.1:{port}", token)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if started.api("GET", "/api/status")[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"jupyter lab did not start: {(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield started
    finally:
        stop_process(proc)
        log.close()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "panel-jupyterlab.log").write_bytes((home / "lab.log").read_bytes())


def _open_notebook(page: Any, lab: Lab) -> None:
    """Open panel.ipynb in JupyterLab and wait until its kernel is idle."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{lab.url}/lab/tree/panel.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    select = page.locator(".jp-Dialog button:has-text('Select')")
    try:  # Lab may ask which kernel to start although the notebook names one
        select.wait_for(timeout=15_000)
        select.click()
    except PlaywrightTimeout:
        pass
    page.wait_for_selector("text=Python 3 (ipykernel) | Idle", timeout=120_000)


def test_the_panel_renders_in_jupyterlab_with_the_run_and_the_local_row(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _open_notebook(page, lab)
            page.click("li.lm-MenuBar-item:has-text('Run')", timeout=60_000)
            page.click("text=Run All Cells", timeout=60_000)
            panel = page.wait_for_selector(".gpu-offload-panel", timeout=120_000)
            page.wait_for_selector(".gpu-offload-panel .gpu-offload-state:text('done')", timeout=120_000)
            page.wait_for_selector(".gpu-offload-panel pre:has-text('step 2')", timeout=60_000)
            text = panel.inner_text()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            panel.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "panel-jupyterlab.png"), full_page=True)
        except Exception:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "panel-jupyterlab-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert "this machine" in text and "✓ default" in text
    assert "No cluster is configured" in text
    assert "close panel" in text


def test_the_runs_extension_lists_the_run_and_names_an_unknown_one(lab: Lab) -> None:
    status, body = lab.api("GET", "/gpu-offload/runs")
    assert status == 200, body
    assert any(r["state"] == "done" and "step 2" in r["tail"] for r in body["runs"]), body
    status, body = lab.api("POST", "/gpu-offload/runs/no-such-run/cancel")
    assert status == 404 and "No run no-such-run" in body["message"], body


def test_notices_are_quiet_outputs_and_the_panel_follows_the_dark_theme(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        try:
            _open_notebook(page, lab)
            page.click("li.lm-MenuBar-item:has-text('Settings')")
            page.click("li.lm-Menu-item:has-text('Theme')")
            page.click("li.lm-Menu-item:has-text('JupyterLab Dark')")
            page.wait_for_selector("body[data-jp-theme-light='false']", state="attached")
            # a fresh kernel: the magic says "no GPU visible" once per kernel, and an earlier test ran this one
            page.click("li.lm-MenuBar-item:has-text('Kernel')")
            page.click("li.lm-Menu-item:has-text('Restart Kernel and Run All Cells')")
            page.click(".jp-Dialog button:has-text('Restart')")
            page.wait_for_selector(".gpu-offload-panel .gpu-offload-state:text('done')")
            cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
            cell.locator(".jp-OutputArea-output:has-text('step 2')").wait_for()
            outputs = cell.locator(".jp-OutputArea-output")
            kinds = [outputs.nth(i).get_attribute("data-mime-type") for i in range(outputs.count())]
            texts = [outputs.nth(i).inner_text() for i in range(outputs.count())]
            # the panel's text is drawn in the theme's font colour: light on the dark theme
            panel_rgb = page.eval_on_selector(
                ".gpu-offload-panel .gpu-offload-state",
                "e => getComputedStyle(e.closest('.gpu-offload-panel').querySelector('div,span') || e).color")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "panel-jupyterlab-dark.png"), full_page=True)
        except Exception:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "panel-jupyterlab-dark-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
    # the cell printed on stdout only: nothing of it (the magic's notices included) is painted as stderr
    assert "application/vnd.jupyter.stderr" not in kinds, list(zip(kinds, texts, strict=True))
    assert any("step 2" in t for t in texts)
    assert any("gpu_offload: no GPU visible" in t for t in texts), texts  # the notice is there, quietly
    red, green, blue = (int(v) for v in panel_rgb[panel_rgb.index("(") + 1:panel_rgb.index(")")].split(",")[:3])
    assert (red + green + blue) / 3 > 128, f"panel text {panel_rgb} is dark on the dark theme"
