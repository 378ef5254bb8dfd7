"""Watches with initial events (WatchList, ``sendInitialEvents``), as kubectl 1.35's ``wait`` and client-go's informers
open them, on the sandbox's API server and on real kube-apiserver 1.35 (tests/realcluster): the same raw requests
get the same events and the same refusals, word for word. The initial events are an ADDED per matching object,
then, when bookmarks are allowed, one BOOKMARK annotated ``k8s.io/initial-events-end`` at a resourceVersion not
older than asked, then live changes; a watch from no resourceVersion that names neither option is defaulted to
that; ``sendInitialEvents`` without ``resourceVersionMatch=NotOlderThan`` (and the reverse) is a 422; a
resourceVersion the server has not reached is a 504 after three seconds."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.watch.watch import iter_resp_lines

from .conftest import api_on_each_cluster

origin = api_on_each_cluster()
SELECTOR = "watch-list=test"
END = {"k8s.io/initial-events-end": "true"}
WATCH_LIST = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"}


def _path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


@contextlib.contextmanager
def watching(api_client: Any, namespace: str, **params: str) -> Iterator[Iterator[dict[str, Any]]]:
    """A raw watch of the namespace's labelled ConfigMaps with ``params``: its events as the server sends them."""
    query = [("watch", "true"), ("labelSelector", SELECTOR), *params.items()]
    query += [] if "timeoutSeconds" in params else [("timeoutSeconds", "30")]
    resp = api_client.call_api(_path(namespace), "GET", query_params=query, auth_settings=["BearerToken"],
                               _preload_content=False, _return_http_data_only=True, _request_timeout=60)
    try:
        yield (json.loads(line) for line in iter_resp_lines(resp) if line)
    finally:
        resp.release_conn()
        resp.close()


def _refusal(api_client: Any, namespace: str, **params: str) -> tuple[int, dict[str, Any]]:
    with pytest.raises(kubernetes.client.ApiException) as err:
        api_client.call_api(_path(namespace), "GET", query_params=list(params.items()), auth_settings=["BearerToken"],
                            _preload_content=False, _return_http_data_only=True, _request_timeout=30)
    return err.value.status, json.loads(err.value.body)


def _cm(core: Any, namespace: str, name: str, labelled: bool = True) -> int:
    made = core.create_namespaced_config_map(namespace, {
        "metadata": {"name": name, "labels": {"watch-list": "test"} if labelled else {}}, "data": {"v": "0"}})
    return int(made.metadata.resource_version)


def _rv(event: dict[str, Any]) -> int:
    return int(event["object"]["metadata"]["resourceVersion"])


@pytest.mark.parametrize("params", [
    pytest.param(WATCH_LIST, id="sendInitialEvents"),
    pytest.param({**WATCH_LIST, "resourceVersion": "listed"}, id="not-older-than-the-list"),
    pytest.param({"allowWatchBookmarks": "true"}, id="defaulted-from-no-resourceVersion"),
])
def test_initial_events_end_with_the_annotated_bookmark_then_changes_follow(
        api_client: Any, core: Any, namespace: str, params: dict[str, str]) -> None:
    _cm(core, namespace, "a")
    _cm(core, namespace, "b")
    _cm(core, namespace, "unlabelled", labelled=False)
    listed = int(core.list_namespaced_config_map(namespace).metadata.resource_version)
    params = {k: str(listed) if v == "listed" else v for k, v in params.items()}
    with watching(api_client, namespace, **params) as events:
        first, second, end = next(events), next(events), next(events)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in (first, second)] == [("ADDED", "a"), ("ADDED", "b")]
        # the bookmark: an empty object of the watched kind holding only the resourceVersion and the annotation
        assert end == {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {
            "resourceVersion": end["object"]["metadata"]["resourceVersion"], "annotations": END}}}
        assert _rv(end) >= max(listed, _rv(first), _rv(second))  # not older than the state the client saw
        made = _cm(core, namespace, "c")
        live = next(events)
        assert (live["type"], live["object"]["metadata"]["name"], _rv(live)) == ("ADDED", "c", made)
        assert made > _rv(end)


def test_initial_events_without_bookmarks_allowed_come_without_the_end_bookmark(
        api_client: Any, core: Any, namespace: str) -> None:
    _cm(core, namespace, "a")
    with watching(api_client, namespace, sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                  timeoutSeconds="1") as events:
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a")]


def test_a_watch_without_initial_events_sends_only_later_changes(api_client: Any, core: Any, namespace: str) -> None:
    _cm(core, namespace, "before")
    with watching(api_client, namespace, sendInitialEvents="false", resourceVersionMatch="NotOlderThan") as events:
        made = _cm(core, namespace, "after")
        event = next(events)
    assert (event["type"], event["object"]["metadata"]["name"], _rv(event)) == ("ADDED", "after", made)


def _invalid(*causes: tuple[str, str, str]) -> dict[str, Any]:
    """kube-apiserver's 422 for refused list options: one cause per (reason, field, message)."""
    messages = [f"{field}: {message}" for _, field, message in causes]
    text = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'ListOptions.meta.k8s.io "" is invalid: {text}', "reason": "Invalid",
            "details": {"group": "meta.k8s.io", "kind": "ListOptions", "causes": [
                {"reason": reason, "message": message, "field": field} for reason, field, message in causes]},
            "code": 422}


FORBIDDEN = "FieldValueForbidden"
NEEDS_MATCH = (FORBIDDEN, "resourceVersionMatch",
               "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")


@pytest.mark.parametrize(("params", "causes"), [
    pytest.param({"watch": "true", "sendInitialEvents": "true"}, [NEEDS_MATCH], id="initial-events-without-match"),
    pytest.param({"watch": "true", "resourceVersion": "1", "resourceVersionMatch": "NotOlderThan"}, [
        (FORBIDDEN, "resourceVersionMatch",
         "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")],
        id="match-without-initial-events"),
    pytest.param({"watch": "true", "sendInitialEvents": "true", "resourceVersionMatch": "Exact"}, [
        NEEDS_MATCH,
        ("FieldValueNotSupported", "resourceVersionMatch", 'Unsupported value: "Exact": supported values: "NotOlderThan"')],
        id="exact-with-initial-events"),
    pytest.param({"sendInitialEvents": "true"}, [
        (FORBIDDEN, "sendInitialEvents", "Forbidden: sendInitialEvents is forbidden for list")], id="list"),
    pytest.param({"resourceVersionMatch": "NotOlderThan"}, [
        (FORBIDDEN, "resourceVersionMatch", "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is "
         "provided")], id="list-match-without-resourceVersion"),
])
def test_refused_options_are_a_422_naming_each_cause(api_client: Any, namespace: str, params: dict[str, str],
                                                     causes: list[tuple[str, str, str]]) -> None:
    assert _refusal(api_client, namespace, **params) == (422, _invalid(*causes))


def test_initial_events_not_older_than_a_version_not_reached_end_in_a_504(
        api_client: Any, core: Any, namespace: str) -> None:
    listed = int(core.list_namespaced_config_map(namespace).metadata.resource_version)
    ahead = listed + 10_000_000
    with watching(api_client, namespace, **WATCH_LIST, resourceVersion=str(ahead)) as events:
        [error] = list(events)  # after waiting three seconds for the store to get there, the stream ends
    assert error["type"] == "ERROR"
    status = error["object"]
    current = re.fullmatch(rf"Timeout: Too large resource version: {ahead}, current: (\d+)", status.pop("message"))
    assert current and listed <= int(current[1]) < ahead
    assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Timeout",
                      "details": {"causes": [{"reason": "ResourceVersionTooLarge",
                                              "message": "Too large resource version"}], "retryAfterSeconds": 1},
                      "code": 504}
