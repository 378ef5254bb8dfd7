"""The hub-managed service: ``python -m gpu_offload.hub_extension.service.app`` (JupyterHub starts it).

It listens before it imports the service (``server``). JupyterHub 5.4 gives a managed service ten tries to
answer over HTTP, one second each, then exits ("Cannot connect to gpu-offload service managed"); a port not yet
bound refuses each try at once, while a bound one keeps the hub's request waiting for its answer (up to its HTTP
client's timeout, 20 s). The service's imports (JupyterHub's auth, SQLAlchemy, the Kubernetes client) take about
5 s on an idle 2-core machine and took 32 to 78 s on the real cluster's hub at load average 24 to 32, so binding
first is what lets a loaded hub start: the requests made meanwhile wait in the backlog and are answered once
the application serves them. Nothing heavier than the standard library is imported before ``bind``.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from .listening import bind, listen_address


def main() -> int:
    """Entry point; configuration errors end the process with the message, not a traceback."""
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s gpu-offload] %(message)s")
    host, port = listen_address(0)
    try:
        sockets = bind(host, port) if port else []  # no port in the URL: the config's, once it is read
    except OSError as exc:
        print(f"gpu-offload service: cannot listen on {host}:{port} ({exc}); JUPYTERHUB_SERVICE_URL names the "
              "address: free that port or give the service another one", file=sys.stderr)
        return 1
    # the service itself, imported once the port is taken (the module's docstring says why)
    from gpu_offload.liqo_peering.errors import GpuOffloadError

    from ..config import load_config
    from .server import serve

    try:
        config = load_config()
        asyncio.run(serve(config, sockets))
    except GpuOffloadError as exc:
        print(f"gpu-offload service: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
