"""What the chart's hub runs at start (its ``hub.extraConfig``): JupyterHub and kubespawner wired to gpu-offload
under this release's names.

A values file cannot spell names that follow the Helm release, so they are found here, at start:
zero-to-jupyterhub's helpers give the release's name (``get_config``, from its hub Secret) and the hub
Service's (``get_name``, from its hub ConfigMap), and this release's gpu-offload ConfigMap (read through the API with the hub's account: a volume
would need its name in the values) gives the project's settings and the roles the spawner hook binds. The
settings land in a private file the spawner hook (this process) and the service (a subprocess) both read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering.errors import GpuOffloadError

from ..config import POD_SECURITY_LABEL, USER_NAMESPACE_LABEL, HubConfig, parse_config
from .release_config import CONFIG_KEY, read_config_map

SERVICE_NAME = "gpu-offload"

# Set by zero-to-jupyterhub on the hub container (fieldRef metadata.namespace).
NAMESPACE_VARIABLE = "POD_NAMESPACE"
# In-cluster configuration of the API client needs these two; a hub-managed service inherits almost nothing
# of the hub's environment.
_KUBERNETES_VARIABLES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


@dataclass(frozen=True)
class ReleaseNames:
    """This release's names, as zero-to-jupyterhub's name table and the hub's environment give them."""

    namespace: str
    fullname: str
    """The prefix of the chart's own objects (``release_fullname``)."""
    hub_service: str
    hub_port: str

    @property
    def config_map(self) -> str:
        """The chart's ConfigMap (``gpu-offload.configMap`` in templates/_helpers.tpl)."""
        return f"{self.fullname}-config"

    @property
    def config_role(self) -> str:
        """The Role that lets the hub's account read it (templates/rbac-hub-config.yaml)."""
        return f"{self.fullname}-hub-config"


def release_fullname(release: str) -> str:
    """``gpu-offload.fullname`` of templates/_helpers.tpl: the release name when it says gpu-offload."""
    return release if "gpu-offload" in release else f"{release}-gpu-offload"


def release_names(get_config: Callable[[str], Any], get_name: Callable[[str], str],
                  get_name_env: Callable[[str, str], str], environ: Mapping[str, str]) -> ReleaseNames:
    """The names from zero-to-jupyterhub's helpers (``z2jh.get_config``/``get_name``/``get_name_env``) and the
    environment."""
    namespace = environ.get(NAMESPACE_VARIABLE, "")
    if not namespace:
        raise GpuOffloadError(f"{NAMESPACE_VARIABLE} is not set in the hub's environment: the gpu-offload chart's "
                              "hub runs in zero-to-jupyterhub's hub pod, which sets it; set it to the release's "
                              "namespace when running the hub elsewhere")
    release = get_config("Release.Name")
    if not release:
        raise GpuOffloadError("zero-to-jupyterhub's values carry no Release.Name: the gpu-offload hub wiring runs "
                              "only in the hub of the gpu-offload chart")
    return ReleaseNames(namespace=namespace, fullname=release_fullname(str(release)),
                        hub_service=get_name("hub"), hub_port=get_name_env("hub", "_SERVICE_PORT"))


def write_private(text: str, directory: Path | None = None) -> Path:
    """``text`` in a new file only this user can read (the settings name the database URL)."""
    folder = Path(tempfile.mkdtemp(prefix="gpu-offload-", dir=directory))
    path = folder / CONFIG_KEY
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    return path


def apply(c: Any, names: ReleaseNames, config: HubConfig, config_path: Path, environ: Mapping[str, str]) -> None:
    """Set JupyterHub's and kubespawner's configuration ``c`` for gpu-offload (pure over ``c``)."""
    from .hooks import pre_spawn_hook, profile_list

    # The chart's admission policy lets the hub create only namespaces named <prefix><user> that carry the
    # label at creation, and the hook checks the same.
    spawner = c.KubeSpawner
    spawner.enable_user_namespaces = True
    spawner.user_namespace_template = config.user_namespace_prefix + "{username}"
    # kubespawner creates the namespace again after the hook made it: the admission policy judges that request
    # before the API server finds the namespace exists (403, not kubespawner's expected 409), so it must carry
    # the labels the policy requires too (seen on a real cluster: every spawn failed).
    spawner.user_namespace_labels = {USER_NAMESPACE_LABEL: "true", "hub.jupyter.org/network-access-hub": "true",
                                     POD_SECURITY_LABEL: config.user_namespaces.pod_security}
    # Creates the namespace, binds the chart's two per-namespace roles, creates the users' server account and
    # the NamespaceOffloading, and sets the magic's environment, before the server starts.
    spawner.pre_spawn_hook = pre_spawn_hook
    spawner.profile_list = profile_list
    # Users' servers meet Pod Security's "restricted" level, so user namespaces can enforce it;
    # zero-to-jupyterhub sets runAsUser (singleuser.uid) and allowPrivilegeEscalation=false itself.
    spawner.pod_security_context = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    spawner.container_security_context = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # The hub Service's short name resolves only inside the hub's namespace; users' servers live elsewhere.
    hub_host = f"{names.hub_service}.{names.namespace}.svc"
    c.JupyterHub.hub_connect_url = f"http://{hub_host}:{names.hub_port}"
    environment = dict(spawner.environment) if "environment" in spawner else {}
    environment[E.SERVICE_URL.name] = f"http://{hub_host}:{config.port}/services/{SERVICE_NAME}/"
    spawner.environment = environment

    services = [s for s in c.JupyterHub.services if s.get("name") == SERVICE_NAME]
    if not services:
        raise GpuOffloadError(f"jupyterhub.hub.services has no {SERVICE_NAME} entry: keep the gpu-offload chart's")
    service = services[0]
    # The proxy reaches the service through the hub Service's extra port, so it listens on all interfaces.
    service["url"] = f"http://{names.hub_service}:{config.port}"
    service_env = service.setdefault("environment", {})
    service_env[E.HUB_CONFIG.name] = str(config_path)
    for key in _KUBERNETES_VARIABLES:
        if key in environ:
            service_env[key] = environ[key]


def wire_hub(c: Any, get_config: Callable[[str], Any], get_name: Callable[[str], str],
             get_name_env: Callable[[str, str], str], environ: MutableMapping[str, str] | None = None,
             api_client: Any = None) -> HubConfig:
    """Read this release's settings and wire the hub (what ``hub.extraConfig.gpu-offload`` calls)."""
    from gpu_offload.liqo_peering.client import api_client_from_environment

    environ = os.environ if environ is None else environ
    names = release_names(get_config, get_name, get_name_env, environ)
    text = read_config_map(api_client or api_client_from_environment(), names.namespace, names.config_map,
                           names.config_role)
    where = f"ConfigMap {names.namespace}/{names.config_map}"
    raw = yaml.safe_load(text)
    if not isinstance(raw, Mapping):
        raise GpuOffloadError(f"{where}: {CONFIG_KEY} must be a mapping; upgrade the gpu-offload chart to rewrite it")
    config = parse_config(raw, where)
    path = write_private(text)
    # The spawner hook runs in this process and reads the settings from there.
    environ[E.HUB_CONFIG.name] = str(path)
    apply(c, names, config, path, environ)
    # The GPU profiles read the inventory cache without waiting: start it now so it has listed the donors by
    # the time users open the spawn page (a failure here shows on that page instead).
    from .hooks import start_inventory

    with contextlib.suppress(GpuOffloadError):
        start_inventory()
    return config
