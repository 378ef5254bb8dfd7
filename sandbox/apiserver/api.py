"""The in-process API: every verb with the semantics of kube-apiserver, shared by the HTTP handlers and by
in-process controllers (job controller here; scheduler, kubelet and Liqo controllers in part 2).

Extension points, all reached from one :class:`Api` (``server.api``):

- ``api.admission`` — mutating and validating hooks per resource (``admission.py``);
- ``api.store.subscribe(...)`` — change notifications for controllers (``store.py``);
- ``api.logs`` — container log buffers the kubelet writes to (``logs.py``);
- ``api.streams`` — attach/exec providers per node (``streams.py``);
- ``api.faults`` — HTTP fault rules (``http_faults.py``);
- ``api.pod_termination`` — set by a kubelet: ``pod_termination(pod) -> bool`` says that the kubelet will
  finish a graceful deletion of that (bound) pod itself, by deleting it again with ``grace_period=0`` once
  its processes ended. Without it, pods are removed at once, as on a node that is gone.

Calls are synchronous, thread-safe (one re-entrant lock, the store's) and never block on I/O, so they are
safe from the server's loop and from other threads. Controllers run as asyncio tasks on the server's loop.
Errors are :class:`~gpu_offload.sandbox.apiserver.errors.ApiError`, exactly what an HTTP client would receive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import crd_defaults, defaults, fieldvalidation, lifecycle
from .admission import Admission, AdmissionRequest
from .errors import (
    NOT_FOUND,
    ApiError,
    Cause,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    invalid,
    not_found,
)
from .field_rules import field_causes
from .http_faults import Faults
from .logs import LogBuffers
from .patching import apply_patch
from .resources import ResourceRegistry, ResourceType
from .selectors import Selector
from .store import Obj, Store, Subscription, clone
from .streams import StreamProviders
from .validation import validate_object

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class Api:
    """One emulated cluster's API: storage, admission, logs, streams and faults."""

    def __init__(self, registry: ResourceRegistry | None = None) -> None:
        self.registry = registry or ResourceRegistry()
        self.store = Store()
        self.admission = Admission()
        self.logs = LogBuffers()
        self.streams = StreamProviders()
        self.faults = Faults()
        self.pod_termination: Callable[[Obj], bool] | None = None
        self.unreachable_nodes: set[str] = set()
        """Nodes whose kubelet does not answer (``controllers/nodelifecycle.py``): no logs, attach or exec there."""
        self.field_validation = "Warn"
        """What a request without ``fieldValidation`` gets: Warn as kube-apiserver; Strict for project tests."""
        ns = self.type("", "v1", "namespaces")
        for name in SYSTEM_NAMESPACES:
            self.create(ns, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # ---- resource types -------------------------------------------------------------------------
    def type(self, group: str, version: str, plural: str) -> ResourceType:
        """The served type at group/version/plural, or the 404 kube-apiserver answers (its exact words:
        clients match on them)."""
        rt = self.registry.lookup(group, version, plural)
        if rt is None:
            raise ApiError(404, "NotFound", NOT_FOUND)
        return rt

    def kind(self, api_version: str, kind: str) -> ResourceType:
        """The served type for objects of this apiVersion and kind, or a 404."""
        rt = self.registry.by_kind(api_version, kind)
        if rt is None:
            raise ApiError(404, "NotFound", f"no resource serves {api_version} {kind}: load its CRD first")
        return rt

    # ---- reads ----------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        """The object, or 404."""
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.group, rt.plural, name)
        obj["apiVersion"] = rt.api_version
        return obj

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        """The object or None (for controllers, which check existence often)."""
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        return obj

    def list(self, rt: ResourceType, namespace: str | None = None, selector: Selector | None = None,
             copy: bool = True) -> Obj:
        """A ``<Kind>List`` of the matching objects with the list's resourceVersion.

        ``copy=False`` hands out the stored objects themselves, for callers that only serialize them.
        """
        items, rv = self.store.snapshots(rt.key, namespace if rt.namespaced else None)
        sel = selector or Selector()
        kept = [dict(clone(o) if copy else o, apiVersion=rt.api_version) for o in items if sel.matches(o)]
        return {"apiVersion": rt.api_version, "kind": f"{rt.kind}List",
                "metadata": {"resourceVersion": str(rv)}, "items": kept}

    def watch(self, rt: ResourceType, namespace: str | None, since: int | None) -> Subscription:
        """Events of ``rt`` after resourceVersion ``since`` (None: from now) on the running loop."""
        return self.store.subscribe(rt.key, namespace if rt.namespaced else None, since)

    # ---- writes ---------------------------------------------------------------------------------
    def _admit(self, op: str, rt: ResourceType, obj: Obj, old: Obj | None, subresource: str = "") -> None:
        meta = obj["metadata"]
        req = AdmissionRequest(op, rt, meta.get("namespace", ""), meta.get("name", ""), obj, old, subresource)
        try:
            # fieldValidation judges what the client sent, before admission: as kube-apiserver decodes first
            causes = fieldvalidation.apply(obj, validate_object(rt, obj))
            sent = clone(obj)
            if self.admission.mutate(req) and obj != sent:  # only a changed object is validated again
                causes = validate_object(rt, obj)
        except LookupError as exc:
            raise ApiError(500, "InternalError", str(exc)) from exc
        causes += field_causes(rt, obj) if not causes else ()
        if causes:
            raise invalid(rt.group, rt.kind, req.name, causes)
        self.admission.validate(req)

    def create(self, rt: ResourceType, body: Obj, namespace: str = "") -> Obj:
        """POST: 201 semantics (the caller sends the code). 409 if the name is taken, 422 if invalid."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise bad_request(f"the body of a {rt.kind} must be a JSON object with a metadata object")
        self._check_kind(rt, body)
        meta = body.setdefault("metadata", {})
        if rt.namespaced:
            namespace = self._request_namespace(rt, meta, namespace)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(rt.group, rt.kind, "", (Cause(
                    "FieldValueRequired", "Required value: name or generateName is required", "metadata.name"),))
            meta["name"] = defaults.generate_name(meta["generateName"])
        if causes := defaults.name_causes(rt, meta["name"]):
            raise invalid(rt.group, rt.kind, meta["name"], tuple(causes))
        with self.store.lock:
            if rt.namespaced:
                self._check_namespace_open(rt, namespace, meta["name"])
            obj = defaults.on_create(rt, body, namespace)
            self._admit("CREATE", rt, obj, None)
            if self.store.get(rt.key, namespace, obj["metadata"]["name"]) is not None:
                raise already_exists(rt.group, rt.plural, obj["metadata"]["name"])
            stored = self.store.put(rt.key, obj, "ADDED")
            lifecycle.after_create(self, rt, stored)
            return stored

    def _check_kind(self, rt: ResourceType, body: Obj) -> None:
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
            raise bad_request(
                f"the API version in the data ({api_version}) and kind ({kind}) do not match the endpoint "
                f"({rt.api_version} {rt.kind}): send the object to the URL of its own resource"
            )

    def _request_namespace(self, rt: ResourceType, meta: Obj, namespace: str) -> str:
        body_ns = meta.get("namespace")
        if body_ns and namespace and body_ns != namespace:
            raise bad_request(
                f"the namespace of the provided object ({body_ns}) does not match the namespace sent on the "
                f"request ({namespace})"
            )
        namespace = namespace or body_ns or ""
        if not namespace:
            raise bad_request(f"{rt.kind} is namespaced: give a namespace in the URL or in metadata.namespace")
        return namespace

    def _check_namespace_open(self, rt: ResourceType, namespace: str, name: str) -> None:
        ns = self.store.get(("", "namespaces"), "", namespace)
        if ns is None:
            raise not_found("", "namespaces", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise forbidden(rt.group, rt.plural, name,
                            f'{rt.plural} "{name}" is forbidden: unable to create new content in namespace '
                            f"{namespace} because it is being terminated")

    def replace(self, rt: ResourceType, namespace: str, name: str, body: Obj, subresource: str = "") -> Obj:
        """PUT (main resource or ``status``): 409 on a stale resourceVersion, 422 if invalid."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {rt.kind} must be a JSON object")
        self._check_kind(rt, body)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise bad_request(f'the name of the object ({meta.get("name")}) does not match the name on the URL ({name})')
        with self.store.lock:
            old = self.get(rt, namespace, name)
            expected = meta.get("resourceVersion")
            if expected and expected != old["metadata"]["resourceVersion"]:
                raise conflict(rt.group, rt.plural, name, "the object has been modified")
            return self._update(rt, old, body, subresource)

    def patch(self, rt: ResourceType, namespace: str, name: str, patch: Any, content_type: str,
              subresource: str = "") -> Obj:
        """PATCH with merge, strategic merge or JSON patch (``patching.py``)."""
        with self.store.lock:
            old = self.get(rt, namespace, name)
            new = apply_patch(old, patch, content_type)
            if not isinstance(new, dict):
                raise bad_request(f"the patch turned {rt.kind} {name!r} into something that is not an object")
            expected = (new.get("metadata") or {}).get("resourceVersion")
            if expected and expected != old["metadata"]["resourceVersion"]:
                raise conflict(rt.group, rt.plural, name, "the object has been modified")
            return self._update(rt, old, new, subresource)

    def _update(self, rt: ResourceType, old: Obj, body: Obj, subresource: str) -> Obj:
        if subresource and subresource != "status":
            raise bad_request(f"{rt.plural}/{subresource} cannot be updated")
        if subresource == "status":
            new = clone(old)
            new["status"] = clone(body.get("status"))
        else:
            new = clone(body)
            if "status" in rt.subresources:  # the main resource never writes status; one not yet written stays absent
                new.pop("status", None)
                if "status" in old:
                    new["status"] = clone(old["status"])
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        for owned in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "namespace", "name", "generation", "resourceVersion"):
            if owned in old["metadata"]:
                meta[owned] = old["metadata"][owned]
            else:
                meta.pop(owned, None)
        if rt.key == ("", "services") and not subresource:
            defaults.service_port_defaults(new.get("spec") or {})
        if rt.key == ("", "nodes") and not subresource:
            defaults.node_omitted(new.get("spec") or {})
        if rt.custom:
            crd_defaults.apply(rt.schema or {}, new)
        if not subresource and (causes := defaults.update_causes(rt, old, new)):
            raise invalid(rt.group, rt.kind, meta["name"], tuple(causes))
        if defaults.spec_changed(old, new):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        self._admit("UPDATE", rt, new, old, subresource)
        if new == old:
            return old  # a no-op write keeps its resourceVersion and sends no event, as on a real server
        if meta.get("deletionTimestamp") and old["metadata"].get("finalizers") and not meta.get("finalizers") \
                and not meta.get("deletionGracePeriodSeconds"):
            # the last finalizer is gone: the deletion completes, unless a kubelet still has the pod's grace
            # period to finish (it deletes the pod again once its containers stopped)
            return lifecycle.remove(self, rt, new)
        return self.store.put(rt.key, new, "MODIFIED")

    def bind(self, namespace: str, pod: str, node: str) -> Obj:
        """``pods/binding``: set ``spec.nodeName`` once (409 if the pod is already bound)."""
        rt = self.type("", "v1", "pods")
        with self.store.lock:
            obj = self.get(rt, namespace, pod)
            if obj["spec"].get("nodeName"):
                raise conflict("", "pods", pod, f"pod {pod} is already assigned to node {obj['spec']['nodeName']}")
            obj["spec"]["nodeName"] = node
            conditions = obj.setdefault("status", {}).setdefault("conditions", [])
            conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": defaults.now()})
            return self.store.put(rt.key, obj, "MODIFIED")

    def delete(self, rt: ResourceType, namespace: str, name: str, grace_period: int | None = None,
               propagation: str | None = None, preconditions: Obj | None = None) -> Obj:
        """DELETE; returns the object (still present if finalizers or a grace period hold it)."""
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise bad_request(f"propagationPolicy {propagation!r} is not one of Orphan, Background, Foreground")
        with self.store.lock:
            obj = self.get(rt, namespace, name)
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
                raise conflict(rt.group, rt.plural, name, "Precondition failed: UID in precondition does not match")
            if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
                raise conflict(rt.group, rt.plural, name, "Precondition failed: resourceVersion does not match")
            meta = obj["metadata"]
            self.admission.validate(AdmissionRequest("DELETE", rt, meta.get("namespace", ""), name, obj, obj))
            return lifecycle.delete(self, rt, obj, grace_period, propagation)

