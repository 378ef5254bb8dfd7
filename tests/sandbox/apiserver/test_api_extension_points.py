"""The extension points part 2 builds on, used the way it uses them: a plugin registering a controller
and a route, change notifications, a controller added after start, and a crashing controller that does
not take the server down."""

from __future__ import annotations

import json
import urllib.request

import pytest
from aiohttp import web
from gpu_offload.sandbox.server import ApiServer


def labeller_plugin(server: ApiServer) -> None:
    """Labels every new ConfigMap (a controller) and serves /sandbox/hello (a route)."""

    async def labeller(api) -> None:
        cms = api.type("", "v1", "configmaps")
        async for event in api.store.subscribe(cms.key):
            meta = event.object["metadata"]
            if event.type == "ADDED" and "seen" not in (meta.get("labels") or {}):
                api.patch(cms, meta["namespace"], meta["name"], {"metadata": {"labels": {"seen": "yes"}}},
                          "application/merge-patch+json")

    async def hello(_: web.Request) -> web.Response:
        return web.json_response({"hello": "sandbox"})

    server.add_controller(labeller)
    server.app.router.add_get("/sandbox/hello", hello)


@pytest.fixture(scope="module")
def server():
    srv = ApiServer(plugins=[labeller_plugin]).start_in_thread()
    yield srv
    srv.stop_thread()


def _wait_label(server, name, wait):
    api = server.api
    cms = api.type("", "v1", "configmaps")
    return wait(lambda: (api.find(cms, "default", name) or {}).get("metadata", {}).get("labels"), f"label on {name}")


def test_plugin_controller_reacts_to_changes_and_plugin_route_is_served(server, wait):
    cms = server.api.type("", "v1", "configmaps")
    server.api.create(cms, {"metadata": {"name": "a"}}, "default")
    assert _wait_label(server, "a", wait) == {"seen": "yes"}
    with urllib.request.urlopen(f"{server.url}/sandbox/hello", timeout=60) as resp:
        assert json.loads(resp.read()) == {"hello": "sandbox"}


def test_controllers_added_after_start_run_and_a_crash_is_contained(server, wait):
    ran = []

    async def crashing(api) -> None:
        raise RuntimeError("boom")

    async def late(api) -> None:
        ran.append(api.store.resource_version)

    server.add_controller(crashing)
    server.add_controller(late)
    wait(lambda: ran, "the late controller to run")
    cms = server.api.type("", "v1", "configmaps")
    server.api.create(cms, {"metadata": {"name": "b"}}, "default")
    assert _wait_label(server, "b", wait) == {"seen": "yes"}  # the first controller still works


def test_call_runs_a_coroutine_on_the_server_loop(server):
    async def loop_id() -> int:
        import asyncio

        return id(asyncio.get_running_loop())

    assert server.call(loop_id(), timeout=60) == id(server.loop)
