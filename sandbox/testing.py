"""Start a sandbox from tests: ``with running_sandbox(tmp_path) as sb:`` gives a server on 127.0.0.1 with
an ephemeral port in a background thread, a kubeconfig file and configured official clients.

Other packages' ``conftest.py`` files build their fixtures on this (part 2 passes its plugins)::

    @pytest.fixture(scope="session")
    def sandbox(tmp_path_factory):
        with running_sandbox(tmp_path_factory.mktemp("sandbox"), crds=LIQO_CRDS) as sb:
            yield sb
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .apiserver.api import Api
from .apiserver.kubeconfig import write_kubeconfig
from .apiserver.resources import ResourceRegistry
from .server import ApiServer, Plugin


@dataclass(frozen=True)
class RunningSandbox:
    """A started sandbox: its server (and so its in-process ``api``), URL and kubeconfig path."""

    server: ApiServer
    kubeconfig: Path

    @property
    def url(self) -> str:
        """Base URL of the API."""
        return self.server.url

    @property
    def api(self) -> Api:
        """The in-process API (for controllers and for arranging state without HTTP)."""
        return self.server.api

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from the kubeconfig file, as a user would."""
        import kubernetes

        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=config)
        return kubernetes.client.ApiClient(config)


def make_api(crds: Path | Sequence[Path] | None = None) -> Api:
    """An Api serving the built-in kinds plus the CRDs in ``crds`` (folders of YAML manifests)."""
    registry = ResourceRegistry()
    for folder in [crds] if isinstance(crds, Path) else crds or ():
        registry.load_crd_dir(folder)
    return Api(registry)


@contextmanager
def running_sandbox(workdir: Path, crds: Path | Sequence[Path] | None = None, plugins: Iterable[Plugin] = ()
                    ) -> Iterator[RunningSandbox]:
    """Serve a sandbox for the duration of the ``with`` block; the kubeconfig is ``workdir/kubeconfig``."""
    server = ApiServer(make_api(crds), plugins=plugins).start_in_thread()
    try:
        yield RunningSandbox(server, write_kubeconfig(workdir / "kubeconfig", server.url))
    finally:
        server.stop_thread()
