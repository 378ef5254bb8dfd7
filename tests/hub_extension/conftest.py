"""A real JupyterHub 6.1 (dummy authenticator, npm configurable-http-proxy, all on 127.0.0.1) running the
gpu-offload service against the sandbox origin with two donors. One hub per test module.

Users: ``admin`` (hub admin), ``alice`` (plain user, no access to the service's pages), ``vera`` (the
viewer role: custom:gpu-offload:view only). A ``tester`` service with an admin role mints API tokens
for them through the hub's REST API, as an operator would.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_offload.hub_extension.service.local_hub import LocalHub, assign, config_text
from gpu_offload.sandbox.fixtures import stop_process, wait_until
from gpu_offload.sandbox.liqo.origin import RunningOrigin

from ..origins import TWO_A100

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
LIQO_CRDS = SHARED / "liqo-crds"
NODE_BIN = REPO / ".ci" / "node" / "node_modules" / ".bin"
ARTIFACTS = REPO / "test-artifacts" / "hub_extension"
TESTER_TOKEN = "gpu-offload-tester-token-0123456789abcdef"

# The session's origin of this configuration (two donors of 4 A100, Liqo's CRDs), shared by every hub module and
# the Liqo behaviour tests: each module leaves it as it found it, which the pool checks after the module.
origin = TWO_A100.fixture()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def http(method: str, url: str, token: str | None = None, body: Any = None,
         form: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Response:
    """One HTTP request (no redirects followed), answering any status instead of raising; ``body`` is sent as
    JSON (bytes as they are), ``form`` as an HTML form would send it, ``headers`` added."""
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if token:
        request.add_header("Authorization", f"token {token}")
    if data is not None:
        kind = "application/x-www-form-urlencoded" if form is not None else "application/json"
        request.add_header("Content-Type", kind)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=60) as answer:
            return Response(answer.status, answer.read(), dict(answer.headers))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read(), dict(exc.headers))


def offloaded_namespace(client: Any) -> str:
    """A fresh user namespace whose pods Liqo offloads (a NamespaceOffloading in it), as the spawner makes."""
    import kubernetes

    name = f"jhub-u{uuid.uuid4().hex[:6]}"
    kubernetes.client.CoreV1Api(client).create_namespace({"metadata": {"name": name}})
    body = {"apiVersion": "offloading.liqo.io/v1beta1", "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading"}, "spec": {"podOffloadingStrategy": "Remote"}}
    kubernetes.client.CustomObjectsApi(client).create_namespaced_custom_object(
        "offloading.liqo.io", "v1beta1", name, "namespaceoffloadings", body)
    return name


def held_pod(name: str, user: str, cluster: str, trigger: Path, gpus: int = 1) -> dict[str, Any]:
    """A runner pod on ``cluster`` that runs until ``trigger`` exists (pods are local processes here)."""
    wait = f"import os, time\nwhile not os.path.exists({str(trigger)!r}): time.sleep(0.05)"
    return {"metadata": {"name": name, "labels": {"gpu-offload.io/managed-by": "gpu-offload", "gpu-offload.io/user": user},
                         "annotations": {"gpu-offload.io/user": user}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"liqo.io/remote-cluster-id": cluster},
                     "containers": [{"name": "runner", "image": "python:3.11", "command": ["python3", "-c", wait],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


@dataclass
class RunningHub:
    url: str
    """Public URL (the proxy), e.g. http://127.0.0.1:PORT/."""
    service_url: str
    workdir: Path
    liqoctl_log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def token(self, user: str) -> str:
        """An API token of ``user`` (all the user's own scopes), minted through the hub API."""
        if user not in self.tokens:
            answer = http("POST", f"{self.url}hub/api/users/{user}/tokens", TESTER_TOKEN,
                          {"note": "gpu-offload tests", "expires_in": 3600})
            assert answer.status == 201, answer.text
            self.tokens[user] = answer.json()["token"]
        return self.tokens[user]

    def api(self, method: str, path: str, user: str, body: Any = None, form: dict[str, str] | None = None
            ) -> Response:
        """A request to the service through the proxy, authenticated as ``user``."""
        return http(method, f"{self.service_url}{path}", self.token(user), body, form)


def _stand_in_liqoctl(folder: Path, log: Path) -> None:
    """A ``liqoctl`` on PATH that records its arguments and the kubeconfig it was given, then succeeds."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "liqoctl"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        args = sys.argv[1:]
        kubeconfig = open(args[args.index("--remote-kubeconfig") + 1]).read()
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps({{"args": args, "kubeconfig": kubeconfig}}) + "\\n")
        print("peering established (stand-in)")
        """))
    script.chmod(0o755)


def write_hub(workdir: Path, origin: RunningOrigin, liqoctl_enabled: bool, **extra: Any) -> tuple[Path, RunningHub]:
    """The hub's config file and the handle describing it (not started); ``extra``: more chart-level config
    (e.g. ``queueing={"kueue": {"enabled": True}}``)."""
    chp = shutil.which("configurable-http-proxy") or str(NODE_BIN / "configurable-http-proxy")
    assert Path(chp).exists(), "configurable-http-proxy missing: tests/run.sh installs it into .ci/node"
    port, hub_port, proxy_api_port, service_port = (free_port() for _ in range(4))
    liqoctl_log = workdir / "liqoctl-calls.jsonl"
    _stand_in_liqoctl(workdir / "bin", liqoctl_log)
    config = {
        "hubNamespace": "jhub",
        # donor-3 is allowed but not peered: the service must still refuse to ask it for GPUs
        "liqo": {"tenantNamespaces": ["liqo-tenant-donor-1", "liqo-tenant-donor-2", "liqo-tenant-donor-3"]},
        "usageDatabase": {"url": f"sqlite:///{workdir}/usage.sqlite"},
        "peering": {"liqoctlEnabled": liqoctl_enabled},
        # the origin admin trusts donor-2 only; the sandbox's donors label nothing that could change that
        "clusters": {"donor-2": {"trusted": True}},
        **extra,
    }
    (workdir / "gpu-offload.yaml").write_text(yaml.safe_dump(config))
    environment = {
        "KUBECONFIG": str(origin.sandbox.kubeconfig),
        "GPU_OFFLOAD_CONFIG": str(workdir / "gpu-offload.yaml"),
        "PATH": f"{workdir / 'bin'}:{os.environ.get('PATH', '')}",
    }
    local = LocalHub(workdir, chp, port, hub_port, proxy_api_port, service_port, environment)
    extra = [
        # Nobody spawns a server in these tests: logging in lands on the home page.
        assign("JupyterHub.redirect_to_server", False),
        assign("JupyterHub.default_url", "/hub/home"),
        assign("Authenticator.allowed_users", {"admin", "alice", "vera"}),
        assign("JupyterHub.load_groups", {"gpu-offload-viewers": {"users": ["vera"]}}),
        assign("JupyterHub.load_roles", [
            {"name": "gpu-offload-viewer", "scopes": ["custom:gpu-offload:view", "access:services!service=gpu-offload"],
             "groups": ["gpu-offload-viewers"]},
            {"name": "tester", "scopes": ["admin:users", "tokens", "read:users"], "services": ["tester"]},
        ]),
    ]
    path = workdir / "jupyterhub_config.py"
    path.write_text(config_text(local, extra, services=[{"name": "tester", "api_token": TESTER_TOKEN}]))
    return path, RunningHub(local.url, f"{local.url}services/gpu-offload/", workdir, liqoctl_log)


@pytest.fixture(scope="module")
def hub_factory(tmp_path_factory: pytest.TempPathFactory, origin: RunningOrigin
                ) -> Iterator[Callable[..., RunningHub]]:
    """Start hubs for this module (``hub_factory(liqoctl_enabled=..., **config)``); all stopped at the end."""
    procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(liqoctl_enabled: bool = False, **extra: Any) -> RunningHub:
        workdir = tmp_path_factory.mktemp("hub")
        config, hub = write_hub(workdir, origin, liqoctl_enabled, **extra)
        log = (workdir / "hub.log").open("wb")
        env = {**os.environ, "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '')}"}
        proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=workdir,
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append((proc, log))

        def ready() -> bool:
            assert proc.poll() is None, f"JupyterHub exited: {(workdir / 'hub.log').read_text()[-3000:]}"
            try:
                health = http("GET", f"{hub.url}hub/health")
                # the service answers its JSON API once its watches have listed
                inventory = http("GET", f"{hub.service_url}api/inventory", TESTER_TOKEN)
            except OSError:
                return False
            return health.status == 200 and inventory.status == 200 and bool(inventory.json()["clusters"])

        wait_until(ready, "JupyterHub and the gpu-offload service to answer", timeout=120, every=0.3)
        return hub

    yield start
    for proc, log in procs:
        stop_process(proc)
        log.close()
        # the hub's and the service's log, kept for whoever reads a failure later
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log.name, ARTIFACTS / f"{Path(log.name).parent.name}-{proc.pid}.log")


@pytest.fixture(scope="module")
def hub(hub_factory: Callable[..., RunningHub]) -> RunningHub:
    """A hub whose service does not run liqoctl (the chart's default)."""
    return hub_factory(liqoctl_enabled=False)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def _wait(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    return wait_until(check, what, timeout)


@pytest.fixture()
def wait() -> Callable[..., Any]:
    """``wait(check, what)``: poll until truthy (a hang bound, never a speed assertion)."""
    return _wait



@pytest.fixture(scope="session")
def validate() -> Callable[[dict[str, Any]], None]:
    """Validate an object as the API server would: built-in kinds strictly, Liqo kinds against ../shared's CRDs."""
    import jsonschema
    import kubernetes_validate

    schemas = {}
    for path in sorted(LIQO_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        schemas[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def check(obj: dict[str, Any]) -> None:
        if obj["kind"] in schemas:
            jsonschema.Draft202012Validator(schemas[obj["kind"]]).validate(obj)
        else:  # strict; it skips unknown kinds silently, so insist it validated
            assert kubernetes_validate.validate(obj, "1.36", strict=True) == "1.36"

    return check
