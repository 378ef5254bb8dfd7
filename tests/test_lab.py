"""`gpu-offload lab`: JupyterLab against the embedded sandbox, with the runs extension on: a kernel's
offloaded cell runs in a sandbox pod; Ctrl-C stops JupyterLab, its kernels, the sandbox and its pod
processes, and leaves no process behind."""

from __future__ import annotations

import http.cookiejar
import json
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import IO

import kubernetes
import nbformat
import psutil
import pytest
from gpu_offload.sandbox.fixtures import wait_until

GPU_OFFLOAD = Path(sys.executable).parent / "gpu-offload"
URL = re.compile(r"^JupyterLab: (http://127\.0\.0\.1:\d+/)lab\?token=(\w+)$")


class Lab:
    """``gpu-offload lab ARGS`` as a user runs it; ``stop()`` is Ctrl-C, then nothing it started may be left."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([str(GPU_OFFLOAD), "lab", *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.printed: list[str] = []
        self.started: list[psutil.Process] = []

    def until(self, pattern: re.Pattern[str]) -> re.Match[str]:
        """Read its output up to the line ``pattern`` matches (the URL)."""
        stream: IO[str] | None = self.process.stdout
        assert stream is not None
        for line in stream:
            self.printed.append(line)
            match = pattern.match(line.strip())
            if match:
                return match
        raise AssertionError("gpu-offload lab ended without printing its URL:\n" + "".join(self.printed))

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def find(self, text: str) -> psutil.Process | None:
        """A process under the lab whose command line contains ``text`` (one that exits while being read is
        skipped: the tree changes while it is walked)."""
        for proc in self.descendants():
            try:
                if text in " ".join(proc.cmdline()):
                    return proc
            except psutil.Error:
                continue
        return None

    def stop(self) -> None:
        self.started = self.descendants()
        self.process.send_signal(signal.SIGINT)
        assert self.process.wait(90) == 0, self.process.stdout.read() if self.process.stdout else ""

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        alive = [p for p in self.started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline() for p in alive]


def execute(base: str, kernel: str, token: str, code: str, wait: bool = True) -> str:
    """Run ``code`` in a kernel of the lab through its websocket, as the browser does; its stdout and stderr
    (``wait=False``: send it and return at once)."""
    import websocket

    ws = websocket.create_connection(f"ws{base[4:]}api/kernels/{kernel}/channels?token={token}", timeout=120)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                                   "session": uuid.uuid4().hex, "version": "5.3"},
                        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": True,
                                    "user_expressions": {}, "allow_stdin": False}}))
    out = ""
    try:
        while wait:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                out += f"{msg['content']['ename']}: {msg['content']['evalue']}"
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        ws.close()
    return out


def request(method: str, url: str, token: str) -> object:
    req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as reply:
        return json.loads(reply.read())


def test_lab_serves_jupyterlab_on_the_sandbox_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    with Lab("--root", str(tmp_path)) as lab:
        base, token = lab.until(URL).groups()
        assert any("SANDBOX" in line for line in lab.printed)
        assert request("GET", f"{base}gpu-offload/runs", token) is not None  # the runs extension is on
        kernel = request("POST", f"{base}api/kernels", token)
        assert isinstance(kernel, dict)
        said = execute(base, kernel["id"], token, "%load_ext gpu_offload.magics")
        said += execute(base, kernel["id"], token, "%%gpu_offload\nprint('on a donor')")
        assert "on a donor" in said and "on virtual node donor-" in said, said
        execute(base, kernel["id"], token, "%%gpu_offload\nimport time\ntime.sleep(300)", wait=False)
        wait_until(lambda: lab.find("runner.pyz"),
                   "the long cell's runner running in a sandbox pod")
        assert lab.find("ipykernel")
        lab.stop()


HUB_URL = re.compile(r"^JupyterHub: (http://127\.0\.0\.1:\d+/)hub/login .*password (\S+)\)$")


def log_in_and_spawn(base: str, user: str, password: str) -> None:
    """Log in through the hub's login form, as a browser does; the hub then starts the user's server."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{base}hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf}).encode()
    browser.open(f"{base}hub/login", form, timeout=120).read()


def test_lab_hub_spawns_a_user_server_set_up_for_the_sandbox_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    with Lab("--hub", "--root", str(tmp_path)) as lab:
        base, password = lab.until(HUB_URL).groups()
        kubeconfig = next(m.group(1) for line in lab.printed if (m := re.search(r"KUBECONFIG=(\S+)\)", line)))
        log_in_and_spawn(base, "alice", password)
        server = wait_until(lambda: lab.find("jupyterhub-singleuser"),
                            "alice's server started by the local spawner")
        env = server.environ()
        assert env["GPU_OFFLOAD_NAMESPACE"] == "gpu-offload-alice" and env["GPU_OFFLOAD_BACKEND"] == "kubernetes"
        assert env["KUBECONFIG"] == kubeconfig and env["GPU_OFFLOAD_SERVICE_URL"].startswith(base)
        core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(kubeconfig))
        labels = core.read_namespace("gpu-offload-alice").metadata.labels  # prepared by the spawner hook
        assert labels["gpu-offload.io/user-namespace"] == "true"
        lab.stop()
        assert server in lab.started


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "lab"


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing: tests/run.sh installs it")
def test_lab_hub_in_a_browser_a_user_offloads_a_cell_and_sees_the_panel(tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    cells = ["%load_ext gpu_offload.magics", "%%gpu_offload\nprint('hello from a donor')", "%gpu_offload panel"]
    spec = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells], metadata=spec),
                   tmp_path / "demo.ipynb")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Lab("--hub", "--root", str(tmp_path)) as lab, sync_playwright() as pw:
        base, password = lab.until(HUB_URL).groups()
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        try:
            page.goto(f"{base}hub/login")
            page.fill("input[name=username]", "alice")
            page.fill("input[name=password]", password)
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_url(re.compile(r".*/user/alice/lab.*"))
            page.goto(f"{base}user/alice/lab/tree/demo.ipynb")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            select = page.locator(".jp-Dialog button:has-text('Select')")
            try:  # Lab may ask which kernel to start although the notebook names one
                select.wait_for(timeout=15_000)
                select.click()
            except PlaywrightTimeout:
                pass
            page.wait_for_selector("text=Python 3 (ipykernel) | Idle")
            page.click("li.lm-MenuBar-item:has-text('Run')")
            page.click("text=Run All Cells")
            page.wait_for_selector(".jp-OutputArea-output:has-text('hello from a donor')")
            placed = page.inner_text(".jp-OutputArea-output:has-text('on virtual node')")
            assert re.search(r"on virtual node donor-\d-gpu \(Liqo cluster donor-\d, 1 x A100\)", placed), placed
            panel = page.wait_for_selector(".gpu-offload-panel")
            page.wait_for_selector(".gpu-offload-panel .gpu-offload-state:text('done')")
            text = panel.inner_text()
            page.screenshot(path=str(ARTIFACTS / "lab-hub-user.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "lab-hub-user-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
        assert "donor-1" in text and "donor-2" in text, text
        lab.stop()
