"""``gpu-offload lab``: JupyterLab (``--hub``: JupyterHub) against an embedded SANDBOX cluster.

It starts the sandbox of ``gpu-offload quickstart`` (an emulated origin with two Liqo donors and an S3 store
on 127.0.0.1, see ``gpu_offload.cli.embedded``), then JupyterLab as a child process whose kernels are set up
for it (kubeconfig, namespace, image, storage) with the runs extension on, and prints the URL. Ctrl-C stops
JupyterLab (it shuts its kernels down), then the sandbox with every pod process: nothing is left running.

``--hub`` starts JupyterHub instead, whose KubeSpawner runs each user's server in a sandbox pod (see
``gpu_offload.cli.lab_hub``). Both need the ``lab`` extra: ``pip install -e '.[lab]'``; ``--hub`` also needs
``configurable-http-proxy`` from npm (``npm install -g configurable-http-proxy``) and root with iproute2's
``ip``, since user servers are pods with their own network. The sandbox runs pods as local processes:
Linux only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .servers import RUNS_EXTENSION, Child, answers, free_port, proxy_command, stop, wait_ready

EXTRA = "pip install -e '.[lab]'"


def add_parser(subparsers: Any, summary: str) -> None:
    """Register ``lab`` on the ``gpu-offload`` command."""
    parser = subparsers.add_parser("lab", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hub", action="store_true",
                        help="JupyterHub with the gpu-offload service and spawner hook instead of JupyterLab")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--root", type=Path, default=None,
                        help="folder the notebooks are in (default: here); not with --hub, whose user servers "
                             "keep their files in their pods")
    parser.set_defaults(func=run)


def missing_requirements(hub: bool) -> list[str]:
    """What the chosen mode needs and this environment lacks, each with how to get it."""
    missing = [f"{module} ({EXTRA})" for module in ("jupyterlab", *(("jupyterhub",) if hub else ()))
               if importlib.util.find_spec(module) is None]
    if hub and proxy_command() is None:
        missing.append("configurable-http-proxy (npm install -g configurable-http-proxy)")
    if hub and not (sys.platform.startswith("linux") and os.geteuid() == 0 and shutil.which("ip")):
        # user servers are pods; a pod's own network and in-cluster files need namespaces (docs/sandbox.md)
        missing.append("root on Linux with iproute2's `ip` (user servers run in sandbox pods with their own "
                       "network; without --hub, `gpu-offload lab` needs neither)")
    return missing


def jupyterlab(workdir: Path, root: Path, port: int, env: Mapping[str, str]) -> Child:
    """JupyterLab on 127.0.0.1 with the runs extension, its kernels in ``env``."""
    token = secrets.token_hex(16)
    config = workdir / "jupyter_server_config.json"
    config.write_text(json.dumps({"ServerApp": {"jpserver_extensions": {RUNS_EXTENSION: True}}}))
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
            f"--config={config}", "--LabApp.news_url=None",  # no popup asking to fetch Jupyter's news
            *(["--allow-root"] if os.geteuid() == 0 else [])]
    log = (workdir / "jupyterlab.log").open("wb")
    # its runtime files (connection files, the runs extension's records) go with the lab's folder
    process = subprocess.Popen(argv, env={**env, "JUPYTER_RUNTIME_DIR": str(workdir / "runtime")}, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                               start_new_session=True)  # Ctrl-C reaches us; we stop it in order
    base = f"http://127.0.0.1:{port}/"

    def ready() -> bool:
        return answers(f"{base}api/status?token={token}")

    return Child(process, f"{base}lab?token={token}", ready)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (or SIGTERM); 2 when an extra is missing, 1 when the server does not start."""
    if args.hub and args.root is not None:
        print("gpu-offload lab: --root is for JupyterLab; with --hub each user's server keeps its files in its "
              "pod: drop --root", file=sys.stderr)
        return 2
    missing = missing_requirements(args.hub)
    if missing:
        print(f"gpu-offload lab: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    from .embedded import embedded_cluster

    root = (args.root or Path.cwd()).resolve()
    port = args.port or free_port()
    # SIGTERM ends this command the way Ctrl-C does, so the with-blocks below stop everything
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="gpu-offload-lab-") as tmp, \
            embedded_cluster(queueing=args.hub, hub=args.hub) as cluster:
        workdir = Path(tmp)
        print(cluster.banner(), flush=True)
        env = cluster.environment(os.environ)
        if args.hub:
            from .lab_hub import jupyterhub

            child, what, log = jupyterhub(workdir, port, cluster, env), "JupyterHub", workdir / "jupyterhub.log"
        else:
            child, what, log = jupyterlab(workdir, root, port, env), "JupyterLab", workdir / "jupyterlab.log"
        try:
            wait_ready(child, log)
            print(f"\n{what}: {child.url}\nStop with Ctrl-C.", flush=True)
            child.process.wait()
            print(f"gpu-offload lab: {what} exited with code {child.process.returncode}", file=sys.stderr)
            return 1
        except RuntimeError as exc:
            print(f"gpu-offload lab: {what} did not start: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"\nstopping {what} and the sandbox", flush=True)
            return 0
        finally:
            stop(child.process)
