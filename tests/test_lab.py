"""`gpu-offload lab`: JupyterLab against the embedded sandbox, with the runs extension on: a kernel's
offloaded cell runs in a sandbox pod; Ctrl-C stops JupyterLab, its kernels, the sandbox and its pod
processes, and leaves no process behind."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO

import kubernetes
import psutil
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from .kernel_channels import execute_code

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

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
        if self.process.poll() is None:  # the test failed before stop(): take down all it started
            self.started = self.descendants()
            self.process.send_signal(signal.SIGINT)  # its own clean-up first (temporary folders)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            for child in self.started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(self.started, timeout=30)
        alive = [p for p in self.started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [p.cmdline() for p in alive]


def execute(base: str, kernel: str, token: str, code: str, wait: bool = True) -> str:
    """Run ``code`` in a kernel of the lab, as the browser does (``wait=False``: send it and return at once)."""
    return execute_code(f"ws{base[4:]}api/kernels/{kernel}/channels?token={token}", code, wait=wait)


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


KUEUE = ("kueue.x-k8s.io", "v1beta2")
HUB_URL = re.compile(r"^JupyterHub: (http://127\.0\.0\.1:\d+/)hub/login .*password (\S+)\)$")
SERVER_START = 300.0
"""Seconds a user's server gets to be a running pod answering: JupyterLab is slow to start on a loaded machine."""


def log_in(base: str, user: str, password: str) -> urllib.request.OpenerDirector:
    """Log in through the hub's login form, as a browser does (the hub then starts the user's server); the
    opener keeps the session's cookies."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{base}hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf}).encode()
    browser.open(f"{base}hub/login", form, timeout=120).read()
    return browser


def sandbox_network(owner: int) -> list[str]:
    """The pod network links and namespaces a sandbox in process ``owner`` holds (podnet.py names them)."""
    bridges = subprocess.run(["ip", "-o", "-d", "link", "show", "type", "bridge"], capture_output=True,
                             text=True, check=True).stdout
    found = [m.group(1) for m in re.finditer(rf"\d+: gpobr(\d+)[:@].*alias gpu-offload-sandbox pid={owner}\b",
                                             bridges)]
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    return [*(f"gpobr{n}" for n in found), *(s for s in spaces for n in found if s.startswith(f"gpo{n}-"))]


def opens_lab(browser: urllib.request.OpenerDirector, base: str, user: str) -> bool:
    """Whether the user's JupyterLab page opens (not the hub's spawn page); the browser then holds the
    server's login cookie, which its API handlers need."""
    try:
        with browser.open(f"{base}user/{user}/lab", timeout=30) as reply:
            return reply.geturl().startswith(f"{base}user/{user}/lab")
    except OSError:
        return False


def user_server(lab: Lab) -> psutil.Process:
    """The user server's process (the container's command, not the sandbox's shim that started it)."""
    for proc in lab.descendants():
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:  # exited while the tree was walked
            continue
        if "jupyterhub-singleuser" in command and "nsinit.py" not in command:
            return proc
    raise AssertionError("no user server process under the lab")


needs_pods = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="user servers are sandbox pods: root and iproute2 (lab --hub says so too)")


@needs_pods
@pytest.mark.timeout(900)
def test_lab_hub_runs_a_users_server_in_a_sandbox_pod_as_the_chart_does_and_ctrl_c_leaves_nothing() -> None:
    with Lab("--hub") as lab:
        base, password = lab.until(HUB_URL).groups()
        kubeconfig = next(m.group(1) for line in lab.printed if (m := re.search(r"KUBECONFIG=(\S+)\)", line)))
        core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(kubeconfig))
        browser = log_in(base, "alice", password)

        def ready_pod() -> object:
            pods = core.list_namespaced_pod("gpu-offload-alice").items
            return next((p for p in pods if p.status.container_statuses
                         and all(c.ready for c in p.status.container_statuses)), None)

        pod = wait_until(ready_pod, "alice's server pod, spawned by KubeSpawner, to be ready", timeout=SERVER_START)
        assert pod.metadata.name == "jupyter-alice"
        node = core.read_node(pod.spec.node_name).metadata.labels or {}
        assert node.get("liqo.io/type") != "virtual-node", pod.spec.node_name  # the origin's own node
        assert pod.spec.service_account_name == "gpu-offload-user-server"  # set by the spawner hook
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert env["GPU_OFFLOAD_NAMESPACE"] == "gpu-offload-alice" and env["GPU_OFFLOAD_BACKEND"] == "kubernetes"
        assert "KUBECONFIG" not in env  # the server reads the API with its service account, as in a cluster
        labels = core.read_namespace("gpu-offload-alice").metadata.labels  # prepared by the spawner hook
        assert labels["gpu-offload.io/user-namespace"] == "true"
        # queueing is on, as on a cluster: the server's cells wait in its LocalQueue, which the hook made, over
        # the ClusterQueue the hub's queue controller keeps following the sandbox's two donors (4 GPUs each)
        assert env["GPU_OFFLOAD_QUEUE"] == "gpu-offload" and env["GPU_OFFLOAD_PRIORITY"] == "interactive"
        custom = kubernetes.client.CustomObjectsApi(core.api_client)
        queue = custom.get_namespaced_custom_object(*KUEUE, "gpu-offload-alice", "localqueues", "gpu-offload")
        assert queue["spec"]["clusterQueue"] == "gpu-offload"
        gpus = [r["nominalQuota"] for f in custom.get_cluster_custom_object(
            *KUEUE, "clusterqueues", "gpu-offload")["spec"]["resourceGroups"][0]["flavors"]
            for r in f["resources"] if r["name"] == "nvidia.com/gpu"]
        assert sorted(gpus) == ["4", "4"], gpus
        # through the proxy, the server's runs extension answers, having read the sandbox from the pod
        wait_until(lambda: opens_lab(browser, base, "alice"), "alice's JupyterLab through the proxy",
                   timeout=SERVER_START)
        with browser.open(f"{base}user/alice/gpu-offload/runs", timeout=60) as reply:
            runs = json.loads(reply.read())
        assert runs == {"runs": [], "problems": []}, runs
        server = user_server(lab)
        assert server.uids().real == 1000
        network = sandbox_network(lab.process.pid)
        assert network, "the sandbox's pod network"
        lab.stop()
        assert server in lab.started
        assert sandbox_network(lab.process.pid) == [], "the pod network outlived gpu-offload lab"


def test_lab_hub_refuses_a_notebook_folder_naming_the_fix() -> None:
    done = subprocess.run([str(GPU_OFFLOAD), "lab", "--hub", "--root", "."], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "drop --root" in done.stderr, done.stderr


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                 "--no-first-run", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts" / "lab"


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_pods
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium missing: tests/run.sh installs it")
def test_lab_hub_in_a_browser_a_user_offloads_a_cell_and_sees_the_panel() -> None:
    from playwright.sync_api import sync_playwright

    cells = ["%load_ext gpu_offload.magics", "%%gpu_offload\nprint('hello from a donor')", "%gpu_offload panel"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Lab("--hub") as lab, sync_playwright() as pw:
        base, password = lab.until(HUB_URL).groups()
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        try:
            page.goto(f"{base}hub/login")
            page.fill("input[name=username]", "alice")
            page.fill("input[name=password]", password)
            page.click("input[type=submit], button[type=submit]")
            # the spawn page follows KubeSpawner's progress, then opens JupyterLab in alice's pod
            page.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=SERVER_START * 1000)
            page.click(".jp-LauncherCard[data-category='Notebook']")
            page.wait_for_selector("text=Python 3 (ipykernel) | Idle")
            for index, code in enumerate(cells):  # typed into the new notebook, as a user does
                page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").click()
                page.keyboard.type(code)
                page.keyboard.press("Shift+Enter")
                page.locator(".jp-Notebook .jp-Cell").nth(index + 1).wait_for()
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
        server = user_server(lab)
        network = sandbox_network(lab.process.pid)
        lab.stop()
        assert server in lab.started
        assert network and sandbox_network(lab.process.pid) == [], network
