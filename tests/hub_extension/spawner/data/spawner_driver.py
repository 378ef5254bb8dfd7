"""Runs one spawner scenario the way the hub process would, and prints the outcome as JSON.

A child process because kubernetes_asyncio (kubespawner's client) reads KUBECONFIG once, when it is
imported: like the hub, this process has the sandbox's kubeconfig in its environment from the start.
Usage: python spawner_driver.py '{"scenario": "hook", "user": "alice"}'
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path
from typing import Any

from gpu_offload.hub_extension.config import load_config
from gpu_offload.hub_extension.spawner import hooks as hook
from gpu_offload.hub_extension.spawner.chart_hub import ReleaseNames, apply
from kubespawner import KubeSpawner
from traitlets.config import Config


def make_spawner(user: str, template: str) -> KubeSpawner:
    """A real KubeSpawner configured as the chart's hub wires it (``chart_hub.apply``), with ``template``."""
    c = Config()
    c.KubeSpawner.namespace = "jhub"
    c.JupyterHub.services = [{"name": "gpu-offload"}]
    apply(c, ReleaseNames("jhub", "gpu-offload", "hub", "8081"), load_config(), Path("config.yaml"), {})
    c.KubeSpawner.user_namespace_template = template
    owner = types.SimpleNamespace(name=user, id=7, url=f"/user/{user}/", escaped_name=user)
    return KubeSpawner(config=c, user=owner, _mock=True)


async def scenario(args: dict[str, Any]) -> dict[str, Any]:
    # The chart's template is "<prefix>{username}" (prefix "<hub namespace>-" by default), spelled out here.
    spawner = make_spawner(args["user"], args.get("template", "jhub-{username}"))
    out: dict[str, Any] = {"namespace": spawner.namespace}
    kind = args["scenario"]
    if kind == "hook":
        await spawner.run_pre_spawn_hook()
    elif kind == "prepare":
        out["created"] = await hook.prepare_namespace(spawner.api.api_client, spawner.namespace, load_config(),
                                                      retries=args["retries"])
    elif kind == "profiles":
        hook.start_inventory()  # as the hub's start does (chart_hub.wire_hub)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, hook.inventory_cache().wait_synced, 60)
        out["profiles"] = hook.profile_list(spawner)
        out["form"] = await spawner._render_options_form_dynamically(spawner)
        spawner.user_options = {"profile": args["choose"]}
        await spawner.load_user_options()
    elif kind == "profiles_held":
        await _profiles_held(spawner, out)
    out["environment"] = dict(spawner.environment)
    out["service_account"] = spawner.service_account
    return out


async def _profiles_held(spawner: KubeSpawner, out: dict[str, Any]) -> None:
    """The spawn page while the test holds the inventory's first list, then once it lets it through."""
    hook.start_inventory()
    # The page renders at once, on this loop, with the standard profile alone...
    out["held_form"] = await spawner._render_options_form_dynamically(spawner)
    out["held_profiles"] = hook.profile_list(spawner)
    # ...and the loop goes on serving the hub's own API calls meanwhile.
    out["served"] = len((await spawner.api.list_namespace()).items)
    print(json.dumps({"held": True}), flush=True)
    sys.stdin.readline()  # the test has released the held list
    loop = asyncio.get_running_loop()
    out["synced"] = await loop.run_in_executor(None, hook.inventory_cache().wait_synced, 60)
    out["profiles"] = hook.profile_list(spawner)


def main() -> None:
    args = json.loads(sys.argv[1])
    try:
        result = asyncio.run(scenario(args))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        result = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
