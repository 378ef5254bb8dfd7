"""The inventory cache: pure event application, and the list/watch/resume/relist loop over a scripted source."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.liqo_peering.cache import InventoryCache, apply_event, object_key
from gpu_offload.liqo_peering.client import ListResult
from gpu_offload.liqo_peering.errors import APIError, APIGone, APIServerError, GpuOffloadError
from gpu_offload.liqo_peering.untrusted_text import MAX_SHOWN


def obj(name: str, rv: str, namespace: str | None = None, **extra: Any) -> dict:
    meta = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, **extra}


def test_apply_added_modified_deleted_bookmark() -> None:
    objects: dict = {}
    assert apply_event(objects, {"type": "ADDED", "object": obj("a", "5", "ns")}) == "5"
    assert apply_event(objects, {"type": "MODIFIED", "object": obj("a", "6", "ns", spec={"x": 1})}) == "6"
    assert objects == {"ns/a": obj("a", "6", "ns", spec={"x": 1})}
    assert apply_event(objects, {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}}) == "9"
    assert list(objects) == ["ns/a"]
    assert apply_event(objects, {"type": "DELETED", "object": obj("a", "10", "ns")}) == "10"
    assert apply_event(objects, {"type": "DELETED", "object": obj("never-seen", "11")}) == "11"
    assert objects == {}


def test_cluster_scoped_and_namespaced_keys_do_not_collide() -> None:
    assert object_key(obj("x", "1")) == "x"
    assert object_key(obj("x", "1", "ns")) == "ns/x"


def test_error_events_raise_gone_or_api_error() -> None:
    with pytest.raises(APIGone, match="HTTP 410: too old resource version"):
        apply_event({}, {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}})
    with pytest.raises(APIError, match="HTTP 500"):
        apply_event({}, {"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd"}})
    with pytest.raises(ValueError, match="unknown type 'SYNC'"):
        apply_event({}, {"type": "SYNC", "object": obj("a", "1")})


def test_an_error_event_s_status_message_is_shown_on_one_bounded_line() -> None:
    # The Status comes from the server, which may be a donor's or one Liqo reflects: what it says reaches the
    # notebook in the error, so escapes, a newline forging a line of ours, and 10 kB must not come through.
    hostile = "too old resource version\x1b[2J\x1b]0;owned\x07\nwatching Pods failed: nothing, all is well\n" + "x" * 10_000
    for code, raised in ((410, APIGone), (500, APIServerError)):
        with pytest.raises(raised) as caught:
            apply_event({}, {"type": "ERROR", "object": {"kind": "Status", "code": code, "message": hostile}})
        text = str(caught.value)
        assert text.startswith(f"watching the inventory failed (HTTP {code}: too old resource version [2J ]0;owned "
                               "watching Pods failed: nothing, all is well xxx")
        assert "\x1b" not in text and "\x07" not in text and "\n" not in text
        assert len(caught.value.detail) == MAX_SHOWN + len("...") and len(text) < 600
    # a Status without message or reason is shown as itself, bounded too
    with pytest.raises(APIServerError) as caught:
        apply_event({}, {"type": "ERROR", "object": {"kind": "Status", "code": 500, "details": {"x": "y" * 10_000}}})
    assert caught.value.detail.startswith("{'kind': 'Status'") and len(caught.value.detail) == MAX_SHOWN + len("...")


def fc(name: str, rv: str) -> dict:
    return {"apiVersion": "core.liqo.io/v1beta1", "kind": "ForeignCluster", "metadata": {"name": name, "resourceVersion": rv},
            "spec": {"clusterID": name}, "status": {"role": "Provider"}}


class ScriptedSource:
    """Plays fixed list answers and watch streams per kind, recording every call; idle watches block."""

    def __init__(self, lists: dict[str, list[ListResult | Exception]], watches: dict[str, list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[tuple[str, ...]] = []
        self.lock = threading.Lock()
        self.idle = {k: threading.Event() for k in ("ForeignCluster", "VirtualNode", "Node", "Pod")}
        self.closed = threading.Event()

    def list(self, kind: str) -> ListResult:
        with self.lock:
            self.calls.append(("list", kind))
            script = self.lists.get(kind) or [ListResult((), "1")]
            answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, kind: str, resource_version: str, timeout_seconds: int, watcher: Any = None) -> Iterator[dict]:
        with self.lock:
            self.calls.append(("watch", kind, resource_version))
            script = self.watches.get(kind) or []
            step = script.pop(0) if script else None
        if isinstance(step, Exception):
            raise step
        if step is None:  # nothing more scripted: behave like a quiet watch until the test ends
            self.idle[kind].set()
            self.closed.wait(60)
            return
        yield from step


def run_cache(source: ScriptedSource) -> InventoryCache:
    cache = InventoryCache(source, max_backoff=0.01).start()
    assert all(e.wait(60) for e in source.idle.values()), source.calls
    return cache


def test_lists_once_then_resumes_from_last_version_and_relists_on_410() -> None:
    source = ScriptedSource(
        lists={"ForeignCluster": [ListResult((fc("a", "1"),), "1"), ListResult((fc("b", "20"),), "20")]},
        watches={"ForeignCluster": [
            [{"type": "ADDED", "object": fc("b", "2")},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "3"}}}],
            APIGone("watching", "ForeignCluster", 410, "too old resource version"),
        ]},
    )
    cache = run_cache(source)
    try:
        fc_calls = [c for c in source.calls if c[1] == "ForeignCluster"]
        assert fc_calls == [("list", "ForeignCluster"), ("watch", "ForeignCluster", "1"), ("watch", "ForeignCluster", "3"),
                            ("list", "ForeignCluster"), ("watch", "ForeignCluster", "20")]
        assert [c.cluster_id for c in cache.inventory().clusters] == ["b"]
        assert cache.stats()["ForeignCluster"]["relists"] == 2
    finally:
        source.closed.set()
        cache.close()


def test_transient_errors_are_retried_and_the_inventory_is_reused_until_a_change() -> None:
    source = ScriptedSource(
        lists={"Node": [APIServerError("listing", "Nodes", 503, "unavailable"), ListResult((), "7")]},
        watches={"ForeignCluster": [[{"type": "ADDED", "object": fc("a", "2")}]]},
    )
    cache = run_cache(source)
    try:
        first = cache.inventory()
        assert cache.inventory() is first  # no change, no rebuild
        assert [c for c in source.calls if c[1] == "Node"][:3] == [("list", "Node"), ("list", "Node"), ("watch", "Node", "7")]
    finally:
        source.closed.set()
        cache.close()


def test_inventory_names_the_kind_that_never_synced() -> None:
    forbidden = APIError("listing", "Pods (cluster-wide)", 403, "pods is forbidden")
    source = ScriptedSource(lists={"Pod": [forbidden]}, watches={})
    cache = InventoryCache(source, max_backoff=0.01).start()
    try:
        with pytest.raises(GpuOffloadError, match=r"could not list Pod \(listing Pods \(cluster-wide\) failed \(HTTP 403"):
            cache.inventory(timeout=0.5)
    finally:
        source.closed.set()
        cache.close()


def test_a_list_refused_for_want_of_rights_is_known_at_once_at_every_read() -> None:
    """A user's kernel without rights on nodes must not wait the whole timeout at every cell: the refusal is
    the answer. (Without it, ``inventory`` below blocks for the hour it is given.)"""
    forbidden = APIError("listing", "Nodes", 403, "nodes is forbidden")
    source = ScriptedSource(lists={"Node": [forbidden]}, watches={})
    cache = InventoryCache(source, max_backoff=0.01).start()
    answers: list[BaseException] = []

    def read() -> None:
        try:
            cache.inventory(timeout=3600)
        except GpuOffloadError as exc:
            answers.append(exc)

    try:
        for _ in range(2):  # the second read, between retries, finds the refusal remembered
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(60)
            assert not reader.is_alive(), "inventory() waited although the list was refused"
        assert len(answers) == 2
        assert all("inventory cache refused: could not list Node (listing Nodes failed (HTTP 403" in str(a)
                   for a in answers)
    finally:
        source.closed.set()
        cache.close(timeout=0)


def test_wait_changed_wakes_on_an_event_and_times_out_without_one() -> None:
    source = ScriptedSource(lists={}, watches={})
    cache = run_cache(source)
    try:
        now = cache.wait_changed(-1, 0)
        assert cache.wait_changed(now, 0.05) == now  # nothing happened: the timeout ends the wait
        woke: list[int] = []
        # an hour: only the event can end this wait within the join's bound
        waiter = threading.Thread(target=lambda: woke.append(cache.wait_changed(now, 3600)), daemon=True)
        waiter.start()
        cache._apply("ForeignCluster", {"type": "ADDED", "object": fc("a", "5")})  # what a watch delivers
        waiter.join(60)
        assert not waiter.is_alive() and woke[0] != now
    finally:
        source.closed.set()
        cache.close()
