"""The Kueue objects' API calls through the official client (the I/O side of ``queue_sync``)."""

from __future__ import annotations

import builtins
import json
from typing import Any

import urllib3
from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from . import labels as L
from .errors import APIForbidden, APINotFound, APIServerError, APIThrottled, GpuOffloadError, api_error
from .kueue_stop import newest_stop_event, stop_event_selector
from .queue_sync import Change
from .retrying import Backoff, retry
from .watching import Collection

KINDS = {g.kind: g for g in (L.RESOURCE_FLAVOR, L.CLUSTER_QUEUE, L.LOCAL_QUEUE, L.WORKLOAD_PRIORITY_CLASS)}
_WORDS = {"create": "creating", "patch": "updating", "delete": "deleting"}
FIND_QUEUE_RETRY = Backoff(first=1.0, cap=4.0, attempts=3)
"""Listing a namespace's LocalQueues when the server failed (5xx, 429): three tries in all, then its error."""


class SeveralLocalQueues(GpuOffloadError):
    """Nothing names the LocalQueue and the namespace has more than one; each front end words the fix."""

    def __init__(self, namespace: str, names: builtins.list[str]) -> None:
        self.namespace = namespace
        self.names = tuple(names)
        super().__init__(f"namespace {namespace} has {len(names)} Kueue LocalQueues ({', '.join(names)})")


class KueueClient:
    """Lists and writes ResourceFlavors, ClusterQueues, LocalQueues and WorkloadPriorityClasses."""

    def __init__(self, api_client: ApiClient, request_timeout: float | None = 30.0) -> None:
        self.api_client = api_client
        self.custom = CustomObjectsApi(api_client)
        self.core = CoreV1Api(api_client)
        self.batch = BatchV1Api(api_client)
        self.request_timeout = request_timeout

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``kind``, cluster-wide or in ``namespace``, as the server sent it."""
        g = KINDS[kind]
        what = f"{kind}s" + (f" in {namespace}" if namespace else "")
        try:
            if namespace:
                found = self.custom.list_namespaced_custom_object(g.group, g.version, namespace, g.plural,
                                                                  _request_timeout=self.request_timeout)
            else:
                found = self.custom.list_cluster_custom_object(g.group, g.version, g.plural,
                                                               _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "listing", what)
            if isinstance(error, APINotFound):
                raise GpuOffloadError(f"listing {what}: the {g.group}/{g.version} API is not served here; install "
                                      "Kueue (docs/queueing.md) before turning queueing on") from exc
            raise error from exc
        return list(found.get("items") or [])

    def local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The LocalQueue ``namespace/name``, None when it does not exist."""
        g = L.LOCAL_QUEUE
        try:
            return dict(self.custom.get_namespaced_custom_object(g.group, g.version, namespace, g.plural, name,
                                                                 _request_timeout=self.request_timeout))
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "reading", f"LocalQueue {namespace}/{name}")
            if isinstance(error, APINotFound):
                return None
            raise error from exc

    def local_queue_names(self, namespace: str) -> builtins.list[str]:
        """The names of the LocalQueues of ``namespace``, sorted; none when Kueue's API is not served (no Kueue
        installed is no queue). A refusal (403) is raised as ``APIForbidden``."""
        g = L.LOCAL_QUEUE
        try:
            found = self.custom.list_namespaced_custom_object(g.group, g.version, namespace, g.plural,
                                                              _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "listing", f"LocalQueues in {namespace}")
            if isinstance(error, APINotFound):
                return []
            raise error from exc
        return sorted(str(q["metadata"]["name"]) for q in found.get("items") or [])

    def cluster_queue(self, name: str) -> Collection:
        """The one ClusterQueue ``name`` as a list/watch collection (a field selector on its name, which RBAC
        allows with ``resourceNames``): its status changes whenever Kueue admits or queues a run."""
        g = L.CLUSTER_QUEUE
        return Collection(f"ClusterQueue {name}", self.custom.list_cluster_custom_object,
                          {"group": g.group, "version": g.version, "plural": g.plural,
                           "field_selector": f"metadata.name={name}"})

    def pending_workloads(self, namespace: str, local_queue: str) -> builtins.list[dict[str, Any]]:
        """Kueue's visibility API: the pending Workloads of one LocalQueue, head first, each with its
        ``positionInClusterQueue`` and ``positionInLocalQueue`` (from 0). The generated client has no such
        call; it goes through the same ``ApiClient`` (auth, TLS) as every other request."""
        path = (f"/apis/{L.VISIBILITY_GROUP}/{L.VISIBILITY_VERSION}/namespaces/{{namespace}}/localqueues/{{name}}/"
                "pendingworkloads")
        try:
            response = self.api_client.call_api(
                path, "GET", path_params={"namespace": namespace, "name": local_queue},
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
                response_types_map={200: "object"}, _preload_content=False, _return_http_data_only=True,
                _request_timeout=self.request_timeout)
            body = json.loads(response.data)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "reading", f"the pending workloads of LocalQueue {namespace}/{local_queue} (Kueue's "
                                            "visibility API)") from exc
        return list(body.get("items") or [])

    def jobs(self, namespace: str, label_selector: str) -> Collection:
        """The Jobs of ``namespace`` matching a label selector, as a list/watch collection: Kueue suspends a Job
        it evicts, and a Job's ``spec.suspend`` says whether it holds its quota."""
        return Collection(f"Jobs in {namespace} matching {label_selector}", self.batch.list_namespaced_job,
                          {"namespace": namespace, "label_selector": label_selector})

    def stop_event(self, namespace: str, kind: str, name: str, uid: str) -> dict[str, Any] | None:
        """The newest ``Stopped`` event Kueue recorded on the ``kind`` ``name`` of this ``uid``, or None."""
        what = f"the events of {kind} {namespace}/{name}"
        try:
            response = self.core.list_namespaced_event(namespace, field_selector=stop_event_selector(kind, name),
                                                       _preload_content=False, _request_timeout=self.request_timeout)
            listed = json.loads(response.data)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "listing", what) from exc
        event = newest_stop_event(listed.get("items") or [], uid)
        return dict(event) if event is not None else None

    def workloads(self, namespace: str) -> builtins.list[dict[str, Any]]:
        """The Workloads of ``namespace`` (Kueue's own record of each queued pod, with its ``QuotaReserved``
        condition saying why it waits). A refusal (403: a chart without the users' read of workloads) is raised
        as ``APIForbidden``."""
        g = L.WORKLOAD
        try:
            found = self.custom.list_namespaced_custom_object(g.group, g.version, namespace, g.plural,
                                                              _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            raise api_error(exc, "listing", f"the Workloads in {namespace}") from exc
        return list(found.get("items") or [])

    def write(self, change: Change) -> None:
        """Create, merge-patch or delete as ``change`` says; a deletion of something already gone is done."""
        g = KINDS[change.kind]
        target = f"{change.kind} {change.namespace + '/' if change.namespace else ''}{change.name}"
        namespaced = change.namespace is not None
        scope = "namespaced" if namespaced else "cluster"
        call = getattr(self.custom, f"{change.verb}_{scope}_custom_object")
        head = (g.group, g.version, change.namespace, g.plural) if namespaced else (g.group, g.version, g.plural)
        args = {"create": (change.body,), "patch": (change.name, change.body), "delete": (change.name,)}[change.verb]
        try:
            call(*head, *args, _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, _WORDS[change.verb], target)
            if change.verb == "delete" and isinstance(error, APINotFound):
                return
            raise error from exc

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """The labels of namespace ``name``, None when it does not exist."""
        try:
            response = self.core.read_namespace(name, _preload_content=False, _request_timeout=self.request_timeout)
        except (ApiException, urllib3.exceptions.HTTPError) as exc:
            error = api_error(exc, "reading", f"namespace {name}")
            if isinstance(error, APINotFound):
                return None
            raise error from exc
        return dict((json.loads(response.data).get("metadata") or {}).get("labels") or {})


def the_local_queue(kueue: KueueClient, namespace: str, backoff: Backoff = FIND_QUEUE_RETRY) -> str | None:
    """The one LocalQueue of ``namespace``: where a kernel's cells and a flow's steps wait when
    ``GPU_OFFLOAD_QUEUE`` names none. None when there is none, no Kueue, or no right to list them (a chart with
    queueing off grants none): queueing stays off, as without Kueue. Several raise :class:`SeveralLocalQueues`;
    a server that keeps failing raises its error after ``backoff.attempts`` tries."""
    try:
        names = retry(lambda: kueue.local_queue_names(namespace), backoff,
                      lambda exc: isinstance(exc, (APIServerError, APIThrottled)))
    except APIForbidden:
        return None
    if len(names) > 1:
        raise SeveralLocalQueues(namespace, names)
    return names[0] if names else None
