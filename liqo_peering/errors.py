"""The errors of the base layer. Every message names the object, the cause and the next step.

API failures are mapped from the client's ``ApiException`` by HTTP status (as kopf does) and chain it, so a
caller can catch ``APINotFound`` instead of comparing status codes, and a traceback still shows the wire.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class GpuOffloadError(Exception):
    """Base of every error this project raises on purpose."""


class InvalidRequest(GpuOffloadError, ValueError):
    """A request or argument is malformed; the message says which value and what would be accepted."""


class APIError(GpuOffloadError):
    """The Kubernetes API refused or failed a request.

    ``status`` is the HTTP status (0 when the server was not reached), ``target`` the object or collection
    the request was about, ``detail`` the server's own message.
    """

    next_step = "retry; if it persists, check the API server's health"

    def __init__(self, action: str, target: str, status: int, detail: str) -> None:
        self.action = action
        self.target = target
        self.status = status
        self.detail = detail
        cause = f"HTTP {status}" if status else "no response"
        super().__init__(f"{action} {target} failed ({cause}: {detail}); {self.next_step}")


class APIUnreachable(APIError):
    next_step = "check that the cluster is reachable and that your kubeconfig points at it"


class APIUnauthorized(APIError):
    next_step = "your credentials were rejected; refresh the kubeconfig (or log in to the hub again)"


class APIForbidden(APIError):
    next_step = "ask your cluster admin for RBAC rights on this resource, or use the hub's inventory"


@dataclass(frozen=True)
class QuotaUse:
    """What a ResourceQuota denial says: the quota's name and the amounts requested, used and allowed."""

    name: str
    requested: str
    used: str
    limited: str


# kube-apiserver's ResourceQuota admission plugin answers 403 with a Status whose details carry only the
# denied object's name and kind (no causes), so the quota's figures exist only in the message it formats as
# "exceeded quota: %s, requested: %s, used: %s, limited: %s". Parsing it here, once, beats an extra read of
# every ResourceQuota of the namespace after each denial, which would also race with the runs that end.
_QUOTA = re.compile(r"exceeded quota: ([^,]+), requested: (.+), used: (.+), limited: (.+)$")


class APIForbiddenByQuota(APIForbidden):
    """403 from the ResourceQuota admission plugin; ``quota`` holds its figures."""

    next_step = "wait for a run to end or ask for less; your admin sets the namespace's quota"

    def __init__(self, action: str, target: str, status: int, detail: str, quota: QuotaUse) -> None:
        super().__init__(action, target, status, detail)
        self.quota = quota


# kube-apiserver's words when a ValidatingAdmissionPolicy denies a request (403 for a validation whose reason
# is Forbidden, 422 by default): "ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied
# request: <the policy's message>", after "<kind> "<name>" is forbidden: " for a 403.
_POLICY_DENIAL = re.compile(r"ValidatingAdmissionPolicy '([^']+)'(?: with binding '[^']*')? denied request: (.*)$",
                            re.DOTALL)


class APIDeniedByPolicy(APIError):
    """The cluster's admission policy refused the object; ``denial`` is the policy's own message. Not an
    ``APIForbidden``: no RBAC right is missing, and asking again changes nothing."""

    next_step = "the cluster's admission policy refused it, and its message says what it allows"

    def __init__(self, action: str, target: str, status: int, detail: str, policy: str, denial: str) -> None:
        super().__init__(action, target, status, detail)
        self.policy = policy
        self.denial = denial


class APINotFound(APIError):
    next_step = "check the name and namespace; for Liqo kinds, check that Liqo is installed (kubectl get crd)"


# kube-apiserver's words when a namespaced object is written to a namespace that does not exist (its
# NamespaceLifecycle admission plugin answers 404 with them).
_MISSING_NAMESPACE = re.compile(r'^namespaces "([^"]+)" not found$')


class APINamespaceMissing(APINotFound):
    """404 because the object's namespace does not exist; ``namespace`` names it."""

    def __init__(self, action: str, target: str, status: int, detail: str, namespace: str) -> None:
        self.namespace = namespace
        self.next_step = f"create it (kubectl create namespace {namespace}) or use one that exists"
        super().__init__(action, target, status, detail)


class APIConflict(APIError):
    next_step = "someone changed it meanwhile; read it again and retry"


class APIGone(APIError):
    next_step = "the resourceVersion is too old; list again and watch from the new one"


class APIInvalid(APIError):
    next_step = "the object was rejected by validation; fix the field the server names"


class APIThrottled(APIError):
    next_step = "the API server is throttling requests (429); retry in a moment"


class APIServerError(APIError):
    next_step = "the API server failed; retry in a moment"


# kube-apiserver's words when an admission webhook that fails closed cannot be reached (500): 'Internal error
# occurred: failed calling webhook "<name>": failed to call webhook: Post "https://<service>.<namespace>.svc:443/
# <path>?timeout=10s": <cause>', the cause being e.g. "dial tcp ...: connect: connection refused" or 'no endpoints
# available for service "<service>"'.
_WEBHOOK_DOWN = re.compile(r'failed calling webhook "([^"]+)": failed to call webhook: \w+ "https://([^./"]+)\.([^./"]+)'
                           r'\.svc[^"]*": (.*)$', re.DOTALL)


class APIWebhookUnavailable(APIServerError):
    """An admission webhook the API server must call did not answer, so the request was refused; ``webhook`` is its
    name and ``service`` its Service (``namespace/name``). Kueue's webhooks (``kueue`` names the Service) see every
    pod of a namespace Kueue manages and fail closed: while Kueue is down, no pod can be created there."""

    def __init__(self, action: str, target: str, status: int, detail: str, webhook: str, service: str,
                 cause: str) -> None:
        self.webhook = webhook
        self.service = service
        self.cause = cause
        self.kueue = "kueue" in service
        namespace = service.partition("/")[0]
        if self.kueue:
            self.next_step = (f"Kueue's admission webhook {webhook} (Service {service}) does not answer ({cause}), so "
                              "the cluster refuses every new pod of the namespaces Kueue queues: Kueue is down or "
                              "restarting. Retry in a minute; if it persists, ask your cluster admin to check Kueue's "
                              f"controller (`kubectl -n {namespace} get pods` and its logs)")
        else:
            self.next_step = (f"the admission webhook {webhook} (Service {service}) does not answer ({cause}) and the "
                              "cluster refuses these requests until it does: ask your cluster admin to check the "
                              f"service behind it (`kubectl -n {namespace} get pods`)")
        super().__init__(action, target, status, detail)


_BY_STATUS: dict[int, type[APIError]] = {
    401: APIUnauthorized,
    403: APIForbidden,
    404: APINotFound,
    409: APIConflict,
    410: APIGone,
    422: APIInvalid,
    429: APIThrottled,
}


def _server_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return str(message)
    return str(getattr(exc, "reason", None) or exc)


def status_error(status: int, action: str, target: str, detail: str) -> APIError:
    """The ``APIError`` for an HTTP status: the one mapping, used for responses and for watch ERROR events."""
    if status == 0:
        return APIUnreachable(action, target, 0, detail)
    denied = _POLICY_DENIAL.search(detail) if status in (403, 422) else None
    if denied is not None:
        return APIDeniedByPolicy(action, target, status, detail, denied.group(1), denied.group(2))
    if status == 403:
        quota = _QUOTA.search(detail)
        if quota is not None:
            return APIForbiddenByQuota(action, target, status, detail, QuotaUse(*quota.groups()))
    if status == 500:
        webhook = _WEBHOOK_DOWN.search(detail)
        if webhook is not None:
            name, service, namespace, cause = webhook.groups()
            return APIWebhookUnavailable(action, target, status, detail, name, f"{namespace}/{service}", cause.strip())
    if status == 404:
        missing = _MISSING_NAMESPACE.match(detail)
        if missing is not None:
            return APINamespaceMissing(action, target, status, detail, missing.group(1))
    cls = _BY_STATUS.get(status, APIServerError if status >= 500 else APIError)
    return cls(action, target, status, detail)


def api_error(exc: Exception, action: str, target: str) -> APIError:
    """Translate a client exception into the matching ``APIError`` (raise it ``from exc``).

    ``exc`` is an ``ApiException`` of ``kubernetes`` or ``kubernetes_asyncio`` (status 0 means the request
    never got an answer) or a transport error.
    """
    status = int(getattr(exc, "status", 0) or 0)
    return status_error(status, action, target, _server_message(exc) if status else str(exc))


class PlacementError(GpuOffloadError):
    """No virtual node can take the request; the message lists what exists."""


class NoFit(PlacementError):
    """Nothing free matches; ``alternatives`` holds (cluster, model, free GPUs) that exist right now."""

    def __init__(self, message: str, alternatives: tuple[tuple[str, str | None, int], ...]) -> None:
        super().__init__(message)
        self.alternatives = alternatives


class CannotShare(PlacementError):
    """A fraction of a GPU was asked of a donor that cannot grant it in the units it lends GPUs in."""


class UnknownName(PlacementError):
    """A name the request gave is not among those that exist; ``valid`` lists the ones that do."""

    def __init__(self, message: str, valid: tuple[str, ...]) -> None:
        super().__init__(message)
        self.valid = valid


class UnknownCluster(UnknownName):
    """The requested cluster id is not peered; ``valid`` lists the ones that are."""


class UnknownModel(UnknownName):
    """The requested GPU model exists on no virtual node; ``valid`` lists the models that do."""


class BundleTooLarge(GpuOffloadError):
    """The bundle is too large to send a pod directly; object storage must carry it."""


class OffloadingMissing(GpuOffloadError):
    """The namespace has no NamespaceOffloading and we may not (or were told not to) create it."""


class OffloadingNotReady(GpuOffloadError):
    """The NamespaceOffloading did not reach a usable phase; the message names the phase."""
