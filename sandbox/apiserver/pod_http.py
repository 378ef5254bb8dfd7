"""The pod subresources served over HTTP: ``log`` (from the log buffers), ``attach``/``exec`` (websocket,
through the registered stream provider), ``portforward`` (websocket, through the registered connector) and
``binding`` (what a scheduler posts)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from typing import Any

from aiohttp import web
from dateutil.parser import isoparse

from . import portforward, streams
from .api import Api
from .errors import ApiError, bad_request
from .logs import LogQuery, LogStreamCut
from .watch_http import client_gone

_TRUE = ("1", "true", "True")


def _pick_container(pod: dict[str, Any], wanted: str | None) -> str:
    name = pod["metadata"]["name"]
    names = [c["name"] for c in pod["spec"].get("containers", [])]
    names += [c["name"] for c in pod["spec"].get("initContainers", []) or []]
    if not wanted:
        if len(pod["spec"].get("containers", [])) == 1:
            return str(names[0])
        raise bad_request(f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]")
    if wanted not in names:
        raise bad_request(f"container {wanted} is not valid for pod {name}")
    return wanted


def _parse_time(value: str) -> datetime:
    try:
        return isoparse(value)
    except ValueError as exc:
        raise bad_request(f"sinceTime={value!r} is not an RFC 3339 time such as 2026-11-22T01:02:03Z") from exc


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise bad_request(f"{name}={value!r} must be an integer") from exc


def _log_query(request: web.Request) -> LogQuery:
    q = request.query
    since = _parse_time(q["sinceTime"]) if q.get("sinceTime") else None
    if (seconds := _int_param(request, "sinceSeconds")) is not None:
        since = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    return LogQuery(follow=q.get("follow") in _TRUE, since_time=since,
                    tail_lines=_int_param(request, "tailLines"), limit_bytes=_int_param(request, "limitBytes"))


def _node_answers(api: Api, pod: dict[str, Any], path: str) -> None:
    """kube-apiserver reaches the pod's kubelet for logs, attach and exec: a node that does not answer is its
    500, in its words (the sandbox's kubelets have no address of their own: the port is a kubelet's default)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node in api.unreachable_nodes:
        raise ApiError(500, "InternalError", f'Get "https://{node}:10250/{path}": dial tcp {node}:10250: connect: '
                                             "connection refused")


async def pod_log(api: Api, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
    """``GET pods/<name>/log``: served while the pod runs; ``follow`` streams until the container ends."""
    pod = api.get(api.type("", "v1", "pods"), namespace, name)
    container = _pick_container(pod, request.query.get("container"))
    _node_answers(api, pod, f"containerLogs/{namespace}/{name}/{container}")
    if not api.logs.has(namespace, name, container) and pod.get("status", {}).get("phase", "Pending") == "Pending":
        raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
    query = _log_query(request)
    stamps = request.query.get("timestamps") in _TRUE
    resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await resp.prepare(request)
    try:
        async for line in api.logs.read(namespace, name, container, query, lambda: client_gone(request)):
            await resp.write((line.rfc3339().encode() + b" " if stamps else b"") + line.text)
    except LogStreamCut:
        # a cut stream must look like a dropped connection, not a clean end
        if request.transport is not None:
            request.transport.abort()
        return resp
    except ConnectionResetError:
        return resp
    with contextlib.suppress(ConnectionResetError):
        await resp.write_eof()
    return resp


def _stream_request(request: web.Request, pod: dict[str, Any], kind: str) -> streams.StreamRequest:
    q = request.query
    command = tuple(q.getall("command", []))
    if kind == "exec" and not command:
        raise bad_request("you must specify at least one command for the container")
    flags = {k: q.get(k) in _TRUE for k in ("stdin", "stdout", "stderr", "tty")}
    if kind == "exec" and not any(flags[k] for k in ("stdin", "stdout", "stderr")):
        raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
    return streams.StreamRequest(kind, pod["metadata"]["namespace"], pod["metadata"]["name"],
                                 _pick_container(pod, q.get("container")), command, flags["stdin"],
                                 flags["stdout"], flags["stderr"], flags["tty"], pod["spec"].get("nodeName", ""))


async def pod_attach_or_exec(api: Api, request: web.Request, namespace: str, name: str,
                             kind: str) -> web.StreamResponse:
    """``pods/<name>/attach`` and ``pods/<name>/exec`` as a channel websocket (``streams.py``)."""
    pod = api.get(api.type("", "v1", "pods"), namespace, name)
    req = _stream_request(request, pod, kind)
    if not req.node:
        raise bad_request(f"pod {name} does not have a host assigned")
    _node_answers(api, pod, f"{kind}/{namespace}/{name}/{req.container}")
    provider = api.streams.find(req.node)
    if provider is None:
        raise bad_request(
            f'unable to upgrade connection: container "{req.container}" of pod {name} on node {req.node} '
            "is not served by any kubelet in this sandbox (register a stream provider)"
        )
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise ApiError(400, "BadRequest", f"pods/{kind} needs a websocket upgrade (protocol v4.channel.k8s.io)")
    return await streams.serve(request, provider, req)


async def pod_port_forward(api: Api, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
    """``pods/<name>/portforward`` as a channel websocket (``portforward.py``)."""
    pod = api.get(api.type("", "v1", "pods"), namespace, name)
    req = portforward.ForwardRequest(namespace, name, portforward.parse_ports(request.query.getall("ports", [])))
    node = pod["spec"].get("nodeName", "")
    connect = api.streams.find_port_forward(node) if node else None
    if connect is None:
        raise bad_request(f"unable to upgrade connection: pod {name} is not running on a node this sandbox's "
                          "kubelet serves (wait until it is Running)")
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise bad_request("pods/portforward needs a websocket upgrade (protocol v4.channel.k8s.io); SPDY is not "
                          "emulated, so kubectl port-forward does not work: use kubernetes.stream.portforward")
    return await portforward.serve(request, connect, req)


def pod_binding(api: Api, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """``POST pods/<name>/binding`` with a ``Binding`` whose target names the node."""
    node = ((body or {}).get("target") or {}).get("name") if isinstance(body, dict) else None
    if not node:
        raise bad_request("a Binding needs target.name (the node to bind the pod to)")
    api.bind(namespace, name, node)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
