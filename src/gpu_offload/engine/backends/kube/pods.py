"""The one module of the kubernetes backend that talks to the API: pods, their Secrets, logs and attach.

Objects go out and come back as plain dicts (``_preload_content=False``): the backend builds them with
``liqo_peering.specs`` and reads them with ``explain``, neither of which needs the client's models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from ....liqo_peering.errors import APIConflict, APINotFound, APIServerError, APIThrottled, api_error
from ....liqo_peering.kueue_stop import newest_stop_event, stop_event_selector
from ....liqo_peering.retrying import Backoff, retry
from ....liqo_peering.watching import READ_MARGIN, Collection, Event, WatchStream

REQUEST_TIMEOUT = 30.0
CREATE_RETRY = Backoff(first=1.0, cap=4.0, attempts=3)
"""A create the server failed (5xx, 429) is tried three times in all, about one and two seconds apart."""


def _server_busy(exc: Exception) -> bool:
    return isinstance(exc, (APIServerError, APIThrottled))


class PodApi:
    """Pods and Secrets of one namespace, through the official client."""

    def __init__(self, api_client: ApiClient, namespace: str, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.batch = BatchV1Api(api_client)
        self.namespace = namespace
        self.request_timeout = request_timeout

    def _json(self, action: str, target: str, func: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            response = func(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)
            return dict(json.loads(response.data))
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, action, target) from exc

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Pod, Secret, Service or (a distributed run's) Job; returns the object as the server stored it (uid, resourceVersion).

        The client does not retry a POST, so a server error (5xx, 429) is retried here a few times: the
        name is fixed, so a create that did land the first time answers 409 and is read back instead.
        """
        kind = body["kind"]
        func = {"Pod": self.core.create_namespaced_pod, "Job": self.batch.create_namespaced_job,
                "Service": self.core.create_namespaced_service}.get(kind, self.core.create_namespaced_secret)
        name = body["metadata"]["name"]
        target = f"{kind} {self.namespace}/{name}"
        attempts = 0

        def attempt() -> dict[str, Any]:
            nonlocal attempts
            attempts += 1
            try:
                return self._json("creating", target, func, self.namespace, dict(body))
            except APIConflict:
                # on a retry, 409 means the first attempt landed after all
                existing = (self.read_pod(name) if kind == "Pod" else dict(body)) if attempts > 1 else None
                if existing is None:
                    raise
                return existing

        return retry(attempt, CREATE_RETRY, _server_busy)

    def read_pod(self, name: str) -> dict[str, Any] | None:
        """The pod, or None when it is gone."""
        try:
            return self._json("reading", f"Pod {self.namespace}/{name}", self.core.read_namespaced_pod, name,
                              self.namespace)
        except APINotFound:
            return None

    def delete_pod(self, name: str, grace: int | None = None) -> bool:
        """Delete the pod (its Secret follows through the owner reference); False if it was already gone."""
        try:
            self._json("deleting", f"Pod {self.namespace}/{name}", self.core.delete_namespaced_pod, name,
                       self.namespace, grace_period_seconds=grace)
        except APINotFound:
            return False
        return True

    def relabel_pod(self, name: str, labels: Mapping[str, str]) -> bool:
        """Set labels of the pod (a merge patch); False if it is gone."""
        try:
            self._json("relabelling", f"Pod {self.namespace}/{name}", self.core.patch_namespaced_pod, name,
                       self.namespace, {"metadata": {"labels": dict(labels)}})
        except APINotFound:
            return False
        return True

    def delete_job(self, name: str, grace: int | None = None) -> bool:
        """Delete a distributed run's Job with its pods (and its Secret and Service, which it owns); False if
        it was already gone. ``propagationPolicy: Background``: without it a Job orphans its pods."""
        try:
            self._json("deleting", f"Job {self.namespace}/{name}", self.batch.delete_namespaced_job, name,
                       self.namespace, grace_period_seconds=grace, propagation_policy="Background")
        except APINotFound:
            return False
        return True

    def delete_secret(self, name: str) -> bool:
        """Delete a Secret; False if it was already gone."""
        return self._delete("Secret", self.core.delete_namespaced_secret, name)

    def _delete(self, kind: str, func: Any, name: str) -> bool:
        try:
            self._json("deleting", f"{kind} {self.namespace}/{name}", func, name, self.namespace)
        except APINotFound:
            return False
        return True

    def watch_pod(self, name: str, resource_version: str, timeout_seconds: int) -> tuple[WatchStream, Iterator[Event]]:
        """Raw watch events of one pod for one server timeout (``type``, ``object``), and the stream that
        another thread may ``stop()``; ERROR events are raised as typed errors (410: ``APIGone``)."""
        stream = WatchStream(f"Pod {self.namespace}/{name}")
        return stream, stream.events(
            self.core.list_namespaced_pod, self.namespace, field_selector=f"metadata.name={name}",
            resource_version=resource_version, timeout_seconds=timeout_seconds,
            _request_timeout=timeout_seconds + READ_MARGIN,
        )

    def open_log(self, name: str, since_time: str | None) -> Any:
        """A follow stream of the pod's log with timestamps, from ``since_time`` (RFC 3339) if given.

        Called through ``call_api`` because the generated ``read_namespaced_pod_log`` lacks ``sinceTime``,
        which resuming a dropped stream needs.
        """
        query: list[tuple[str, str]] = [("follow", "true"), ("timestamps", "true")]
        if since_time:
            query.append(("sinceTime", since_time))
        try:
            response = self.api_client.call_api(
                "/api/v1/namespaces/{namespace}/pods/{name}/log", "GET",
                path_params={"namespace": self.namespace, "name": name}, query_params=query,
                header_params={"Accept": "*/*"}, auth_settings=["BearerToken"], response_types_map={200: "str"},
                _preload_content=False, _return_http_data_only=True,
                _request_timeout=(self.request_timeout, None),
            )
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "following the log of", f"Pod {self.namespace}/{name}") from exc
        return response

    def attach(self, name: str) -> Any:
        """A websocket attached to the runner's stdin (``kubernetes.stream``): a session's commands, a one-shot
        pod's bundle."""
        from kubernetes.stream import stream

        # stream() swaps the ApiClient's request method for a websocket call while it runs: on the shared client,
        # a follower thread's request at that moment would go out as a websocket. A client of its own instead.
        own = ApiClient(self.core.api_client.configuration)
        try:
            return stream(
                CoreV1Api(own).connect_get_namespaced_pod_attach, name, self.namespace, container="runner",
                stdin=True, stdout=False, stderr=False, tty=False, _preload_content=False,
            )
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "attaching to", f"Pod {self.namespace}/{name}") from exc
        finally:
            own.close()  # its connection pool; the websocket is a connection of its own

    def stop_event(self, name: str, uid: str, kind: str = "Pod") -> dict[str, Any] | None:
        """The newest ``Stopped`` event on the ``kind`` (Pod or Job) ``name`` of this ``uid``, or None: Kueue
        records one with the eviction's message when it stops a pod (which it deletes) or suspends a Job."""
        listed = self._json("listing", f"events of {kind} {self.namespace}/{name}", self.core.list_namespaced_event,
                            self.namespace, field_selector=stop_event_selector(kind, name))
        event = newest_stop_event(listed.get("items") or [], uid)
        return dict(event) if event is not None else None

    def pod_events(self, name: str) -> list[dict[str, Any]]:
        """The events on pod ``name`` (any pod of that name: the caller matches the uid)."""
        listed = self._json("listing", f"events of Pod {self.namespace}/{name}", self.core.list_namespaced_event,
                            self.namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}")
        return [dict(e) for e in listed.get("items") or [] if isinstance(e, dict)]

    def events_of_reason(self, reason: str, limit: int = 500) -> list[dict[str, Any]]:
        """Up to ``limit`` events of ``reason`` in the namespace (e.g. the kubelet's ``Pulled``)."""
        listed = self._json("listing", f"{reason} events of namespace {self.namespace}", self.core.list_namespaced_event,
                            self.namespace, field_selector=f"reason={reason}", limit=limit)
        return [dict(e) for e in listed.get("items") or [] if isinstance(e, dict)]

    def pods_matching(self, selector: str) -> Collection:
        """The namespace's pods matching a label selector, as a collection ``watching.ListWatch`` keeps."""
        return Collection(f"pods in {self.namespace} matching {selector}", self.core.list_namespaced_pod,
                          {"namespace": self.namespace, "label_selector": selector})

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        """The pods in the namespace matching a label selector, as JSON."""
        listed = self._json("listing", f"pods in {self.namespace} matching {selector}", self.core.list_namespaced_pod,
                            self.namespace, label_selector=selector)
        return list(listed.get("items") or [])

    def delete_matching(self, selector: str) -> list[str]:
        """Delete the Jobs, pods, Services and Secrets matching a label selector; returns the names that are
        now gone.

        Everything is listed before anything is deleted: a runner Secret is owned by its pod or Job (and a
        distributed run's Service by its Job), so the garbage collector may remove it meanwhile, and it must
        still count as cleaned up. Jobs go first, with ``propagationPolicy: Background`` (a Job whose pods
        were deleted alone would stay, failed, with its Service).
        """
        where = f"in {self.namespace} matching {selector}"
        listed = {
            kind: self._json("listing", f"{kind}s {where}", func, self.namespace, label_selector=selector)
            for kind, func in (("Job", self.batch.list_namespaced_job), ("pod", self.core.list_namespaced_pod),
                               ("Service", self.core.list_namespaced_service),
                               ("Secret", self.core.list_namespaced_secret))
        }
        names = {kind: [item["metadata"]["name"] for item in found.get("items") or []] for kind, found in listed.items()}
        # False from a delete means someone (the garbage collector) was first: gone either way
        for name in names["Job"]:
            self.delete_job(name)
        for name in names["pod"]:
            self.delete_pod(name)
        for name in names["Service"]:
            self.delete_service(name)
        for name in names["Secret"]:
            self.delete_secret(name)
        return names["Job"] + names["pod"] + names["Service"] + names["Secret"]

    def delete_service(self, name: str) -> bool:
        """Delete a Service; False if it was already gone."""
        return self._delete("Service", self.core.delete_namespaced_service, name)
