"""HTTP statuses from the official client become named errors that say what to do, with the cause chained."""

from __future__ import annotations

import json

import pytest
import urllib3
from gpu_offload.liqo_peering.errors import (
    APIConflict,
    APIDeniedByPolicy,
    APIError,
    APIForbidden,
    APIForbiddenByQuota,
    APIGone,
    APIInvalid,
    APINotFound,
    APIServerError,
    APIThrottled,
    APIUnauthorized,
    APIUnreachable,
    APIWebhookUnavailable,
    api_error,
)
from kubernetes.client.exceptions import ApiException


def status_exception(code: int, message: str) -> ApiException:
    exc = ApiException(status=code, reason="Reason")
    exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
    return exc


@pytest.mark.parametrize(
    "code, cls, step",
    [(401, APIUnauthorized, "refresh the kubeconfig"), (403, APIForbidden, "RBAC"), (404, APINotFound, "Liqo is installed"),
     (409, APIConflict, "read it again and retry"), (410, APIGone, "list again"), (422, APIInvalid, "fix the field"),
     (429, APIThrottled, "throttling"), (503, APIServerError, "retry in a moment"), (418, APIError, "retry")],
)
def test_status_maps_to_error_naming_object_cause_and_next_step(code, cls, step) -> None:
    cause = status_exception(code, 'namespaceoffloadings "offloading" is forbidden')
    err = api_error(cause, "creating", "NamespaceOffloading alice/offloading")
    assert type(err) is cls and err.status == code
    text = str(err)
    assert text.startswith(f"creating NamespaceOffloading alice/offloading failed (HTTP {code}: ")
    assert 'namespaceoffloadings "offloading" is forbidden' in text and step in text


def test_cause_is_chained_when_raised_from() -> None:
    cause = status_exception(404, "not found")
    with pytest.raises(APINotFound) as info:
        try:
            raise cause
        except ApiException as exc:
            raise api_error(exc, "reading", "Pod alice/gpuo-1") from exc
    assert info.value.__cause__ is cause


def test_unreachable_server_and_body_without_json() -> None:
    err = api_error(urllib3.exceptions.MaxRetryError(None, "/api", "connection refused"), "listing", "Nodes")
    assert isinstance(err, APIUnreachable) and "kubeconfig points at it" in str(err)
    plain = ApiException(status=500, reason="Internal Server Error")
    plain.body = "<html>proxy error</html>"
    assert "Internal Server Error" in str(api_error(plain, "listing", "Nodes"))


def test_a_resource_quota_denial_carries_the_quotas_figures() -> None:
    # kube-apiserver's ResourceQuota admission plugin: the figures exist only in the message it formats
    message = ('pods "run-1" is forbidden: exceeded quota: gpu-offload, requested: requests.nvidia.com/gpu=1, '
               "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2")
    err = api_error(status_exception(403, message), "creating", "Pod alice/run-1")
    assert isinstance(err, APIForbiddenByQuota) and isinstance(err, APIForbidden)
    assert (err.quota.name, err.quota.requested, err.quota.used, err.quota.limited) == (
        "gpu-offload", "requests.nvidia.com/gpu=1", "requests.nvidia.com/gpu=2", "requests.nvidia.com/gpu=2")
    rbac = api_error(status_exception(403, 'pods is forbidden: User "alice" cannot create'), "creating", "Pod a/b")
    assert type(rbac) is APIForbidden


def test_an_admission_policy_denial_carries_the_policys_own_words() -> None:
    # kube-apiserver's envelope around a ValidatingAdmissionPolicy's message (reason Forbidden: 403)
    said = ("priority class urgent is not one this user may use (the gpu-offload chart's "
            "queueing.kueue.priorityClasses: its users and groups)")
    message = (f'pods "run-1" is forbidden: ValidatingAdmissionPolicy \'gpu-offload-priority-classes\' with binding '
               f"'gpu-offload-priority-classes' denied request: {said}")
    err = api_error(status_exception(403, message), "creating", "Pod alice/run-1")
    assert isinstance(err, APIDeniedByPolicy) and not isinstance(err, APIForbidden)  # nothing to retry, no RBAC
    assert (err.policy, err.denial) == ("gpu-offload-priority-classes", said)
    invalid = api_error(status_exception(422, f"ValidatingAdmissionPolicy 'p' denied request: {said}"), "creating", "x")
    assert isinstance(invalid, APIDeniedByPolicy) and invalid.denial == said


def test_a_webhook_that_does_not_answer_is_named_with_its_service_and_kueues_fix() -> None:
    # kube-apiserver's words with Kueue's process gone (recorded on the real cluster) and with no endpoint at all
    for cause in ("dial tcp 10.219.3.1:29444: connect: connection refused",
                  'no endpoints available for service "kueue-webhook-service"'):
        message = ('Internal error occurred: failed calling webhook "mpod.kb.io": failed to call webhook: Post '
                   f'"https://kueue-webhook-service.kueue-system.svc:443/mutate--v1-pod?timeout=10s": {cause}')
        err = api_error(status_exception(500, message), "creating", "Pod alice/gpuo-1")
        assert isinstance(err, APIWebhookUnavailable) and isinstance(err, APIServerError) and err.kueue
        assert (err.webhook, err.service, err.cause) == ("mpod.kb.io", "kueue-system/kueue-webhook-service", cause)
        assert str(err).endswith(
            f"Kueue's admission webhook mpod.kb.io (Service kueue-system/kueue-webhook-service) does not answer "
            f"({cause}), so the cluster refuses every new pod of the namespaces Kueue queues: Kueue is down or "
            "restarting. Retry in a minute; if it persists, ask your cluster admin to check Kueue's controller "
            "(`kubectl -n kueue-system get pods` and its logs)")
    other = api_error(status_exception(500, 'Internal error occurred: failed calling webhook "v.example.org": '
                                            'failed to call webhook: Post "https://guard.policy.svc:443/validate?'
                                            'timeout=5s": context deadline exceeded'), "creating", "Pod a/b")
    assert isinstance(other, APIWebhookUnavailable) and not other.kueue
    assert "the admission webhook v.example.org (Service policy/guard) does not answer (context deadline " \
           "exceeded)" in str(other) and "`kubectl -n policy get pods`" in str(other)
    plain = api_error(status_exception(500, "etcdserver: request timed out"), "creating", "Pod a/b")
    assert type(plain) is APIServerError
