"""Watch through the official client's ``kubernetes.watch.Watch``: initial state, live events, resume from
a resourceVersion, 410 Gone after compaction, selector transitions, timeoutSeconds."""

from __future__ import annotations

import pytest
from kubernetes import watch
from kubernetes.client import ApiException


def _cm(name, **labels):
    return {"metadata": {"name": name, "labels": labels}, "data": {"v": "0"}}


def test_watch_sends_current_state_then_live_changes(core, ns):
    core.create_namespaced_config_map(ns, _cm("before"))
    seen = []
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, ns, timeout_seconds=30):
        seen.append((ev["type"], ev["object"].metadata.name))
        if seen == [("ADDED", "before")]:  # initial state delivered: now change things
            core.create_namespaced_config_map(ns, _cm("live"))
            core.patch_namespaced_config_map("live", ns, {"data": {"v": "1"}})
            core.delete_namespaced_config_map("before", ns)
        if len(seen) == 4:
            w.stop()
    assert seen == [("ADDED", "before"), ("ADDED", "live"), ("MODIFIED", "live"), ("DELETED", "before")]


def test_watch_resumes_after_a_resource_version_without_losing_or_repeating(core, ns):
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    for i in range(3):
        core.create_namespaced_config_map(ns, _cm(f"c{i}"))
    core.patch_namespaced_config_map("c1", ns, {"data": {"v": "9"}})
    events = [(e["type"], e["object"].metadata.name, e["object"].metadata.resource_version)
              for e in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv,
                                            timeout_seconds=1)]
    assert [(t, n) for t, n, _ in events] == [("ADDED", "c0"), ("ADDED", "c1"), ("ADDED", "c2"), ("MODIFIED", "c1")]
    # resume from the middle: only what came after
    middle = events[1][2]
    later = [(e["type"], e["object"].metadata.name)
             for e in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=middle,
                                           timeout_seconds=1)]
    assert later == [("ADDED", "c2"), ("MODIFIED", "c1")]


def test_watch_from_a_forgotten_resource_version_is_410_gone(core, ns, api_sandbox):
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("x"))
    api_sandbox.api.store.compact()
    with pytest.raises(ApiException) as err:
        for _ in watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5):
            pass
    assert err.value.status == 410
    # the remedy a client applies: list again and watch from the list's resourceVersion
    fresh = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("y"))
    names = [e["object"].metadata.name for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, resource_version=fresh, timeout_seconds=1)]
    assert names == ["y"]


def test_label_selector_watch_sees_objects_enter_and_leave(core, ns):
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("a", app="x"))
    core.create_namespaced_config_map(ns, _cm("b", app="y"))
    core.patch_namespaced_config_map("b", ns, {"metadata": {"labels": {"app": "x"}}})
    core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"app": "z"}}})
    events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, label_selector="app=x", resource_version=rv, timeout_seconds=1)]
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]


def test_field_selector_watch_on_one_object(core, ns):
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("mine"))
    core.create_namespaced_config_map(ns, _cm("other"))
    core.delete_namespaced_config_map("mine", ns)
    events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, field_selector="metadata.name=mine", resource_version=rv,
        timeout_seconds=1)]
    assert events == [("ADDED", "mine"), ("DELETED", "mine")]


def test_a_resumed_watch_never_reports_an_object_that_never_matched(core, ns):
    # "other" exists before the resume point; its changes and deletion after it are none of this watch's
    # business (a pod follower once read another pod's deletion as its own)
    core.create_namespaced_config_map(ns, _cm("other"))
    rv = core.create_namespaced_config_map(ns, _cm("mine")).metadata.resource_version
    core.patch_namespaced_config_map("other", ns, {"data": {"v": "1"}})
    core.patch_namespaced_config_map("mine", ns, {"data": {"v": "1"}})
    core.delete_namespaced_config_map("other", ns)
    events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, ns, field_selector="metadata.name=mine", resource_version=rv,
        timeout_seconds=1)]
    assert events == [("MODIFIED", "mine")]


def test_timeout_seconds_ends_the_stream_cleanly(core, ns):
    events = list(watch.Watch().stream(core.list_namespaced_service_account, ns, timeout_seconds=1))
    assert [e["object"].metadata.name for e in events] == ["default"]


def test_watch_across_all_namespaces_sees_each_namespace(core, ns):
    rv = core.list_config_map_for_all_namespaces().metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("here"))
    events = [(e["object"].metadata.namespace, e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_config_map_for_all_namespaces, resource_version=rv, timeout_seconds=1)]
    assert (ns, "here") in events


def test_a_client_that_goes_away_does_not_leave_its_watch_behind(api_sandbox, core, ns, wait):
    import urllib3

    store = api_sandbox.api.store
    before = store.subscription_count
    core.create_namespaced_config_map(ns, _cm("x"))
    http = urllib3.PoolManager()
    resp = http.request("GET", f"{api_sandbox.url}/api/v1/namespaces/{ns}/configmaps?watch=true",
                        preload_content=False)
    assert b'"ADDED"' in next(resp.stream(decode_content=True))
    assert store.subscription_count == before + 1
    resp.release_conn()
    http.clear()  # closes the socket, as a killed client would
    wait(lambda: store.subscription_count == before, "the server to drop the abandoned watch")


def test_bookmarks_carry_the_last_delivered_resource_version(api_sandbox, core, ns):
    import json as _json

    import urllib3

    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, _cm("a"))
    core.create_namespaced_config_map(ns, _cm("b"))
    url = (f"{api_sandbox.url}/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={rv}"
           "&allowWatchBookmarks=true&timeoutSeconds=5")
    lines = urllib3.PoolManager().request("GET", url).data.decode().splitlines()
    events = [_json.loads(line) for line in lines]
    assert [e["type"] for e in events[:3]] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["resourceVersion"] == events[1]["object"]["metadata"]["resourceVersion"]
    # resuming from the bookmark repeats nothing
    again = list(watch.Watch().stream(core.list_namespaced_config_map, ns,
                                      resource_version=events[2]["object"]["metadata"]["resourceVersion"],
                                      timeout_seconds=1))
    assert again == []
