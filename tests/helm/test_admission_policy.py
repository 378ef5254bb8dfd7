"""The ValidatingAdmissionPolicy confines the hub's cluster-wide creations to user namespaces.

No API server runs here, so the policy's CEL expressions are evaluated with cel-python against admission
requests shaped as the API server builds them (request, object, namespaceObject): the expressions are the
rendered ones, unchanged, and the API server's rule applies: the policy only judges requests that its
match conditions select, and any validation not true (false or an error, failurePolicy Fail) denies.
"""

from __future__ import annotations

from typing import Any

import celpy
import pytest

HUB_USER = "system:serviceaccount:jhub:hub"  # zero-to-jupyterhub's hub account
USER_LABEL = "gpu-offload.io/user-namespace"


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return program.evaluate({key: celpy.json_to_cel(value) for key, value in activation.items()})


def _is_true(result: Any) -> bool:
    """CEL true; an evaluation error (cel-python returns it as a value) or a non-boolean is not."""
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


def admit(
    policy: dict[str, Any], request: dict[str, Any], obj: dict[str, Any], namespace: Any, old: Any = None,
    params: Any = None,
) -> tuple[bool, str]:
    """(allowed, message) for one request under the rendered policy (``old``: oldObject of an UPDATE;
    ``params``: the binding's parameter object, for a policy with a paramKind)."""
    activation = {"request": request, "object": obj, "namespaceObject": namespace, "oldObject": old,
                  "params": params}
    spec = policy["spec"]
    if not all(_is_true(_evaluate(c["expression"], activation)) for c in spec["matchConditions"]):
        return True, "not judged: another requester"
    for validation in spec["validations"]:
        if not _is_true(_evaluate(validation["expression"], activation)):
            message = validation.get("message") or str(_evaluate(validation["messageExpression"], activation))
            return False, message
    return True, ""


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def create(resource: str, obj: dict[str, Any], user: str = HUB_USER) -> dict[str, Any]:
    group = "" if resource == "namespaces" else "rbac.authorization.k8s.io"
    return {
        "operation": "CREATE",
        "userInfo": {"username": user},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "namespace": obj["metadata"].get("namespace", ""),
        "name": obj["metadata"]["name"],
    }


ENFORCE = "pod-security.kubernetes.io/enforce"
ALICE = namespace("jhub-alice", {USER_LABEL: "true", "hub.jupyter.org/network-access-hub": "true",
                                 ENFORCE: "baseline"})


@pytest.fixture(scope="module")
def policy(kit: Any) -> dict[str, Any]:
    return kit.find(kit.render(), "ValidatingAdmissionPolicy", "gpu-offload-hub-user-namespaces")


@pytest.fixture(scope="module")
def hook_bindings(kit: Any) -> list[dict[str, Any]]:
    return kit.hook_bindings(kit.config_of(kit.render()), "jhub-alice")


def test_the_hub_may_create_a_labelled_user_namespace(policy: dict[str, Any]) -> None:
    assert admit(policy, create("namespaces", ALICE), ALICE, None) == (True, "")


@pytest.mark.parametrize(
    "ns",
    [
        namespace("jhub-alice"),
        namespace("jhub-alice", {USER_LABEL: "false"}),
        namespace("kube-alice", {USER_LABEL: "true", ENFORCE: "baseline"}),
    ],
    ids=["no label", "label false", "wrong prefix"],
)
def test_the_hub_may_not_create_any_other_namespace(policy: dict[str, Any], ns: dict[str, Any]) -> None:
    allowed, message = admit(policy, create("namespaces", ns), ns, None)
    assert not allowed
    assert USER_LABEL in message and "jhub-<user>" in message and ns["metadata"]["name"] in message


def test_other_requesters_are_not_judged(policy: dict[str, Any]) -> None:
    ns = namespace("team-x")
    assert admit(policy, create("namespaces", ns, user="kubernetes-admin"), ns, None)[0]


def test_the_spawner_hooks_bindings_are_admitted_in_a_user_namespace(
    policy: dict[str, Any], hook_bindings: list[dict[str, Any]]
) -> None:
    for binding in hook_bindings:
        assert admit(policy, create("rolebindings", binding), binding, ALICE) == (True, ""), binding


def test_the_same_bindings_are_denied_outside_user_namespaces(
    policy: dict[str, Any], hook_bindings: list[dict[str, Any]]
) -> None:
    for target in (
        namespace("kube-system"),
        namespace("jhub-alice-but-unlabelled"),
        namespace("other", {USER_LABEL: "true"}),
    ):
        for binding in hook_bindings:
            moved = {**binding, "metadata": {**binding["metadata"], "namespace": target["metadata"]["name"]}}
            allowed, message = admit(policy, create("rolebindings", moved), moved, target)
            assert not allowed, target
            assert target["metadata"]["name"] in message


@pytest.mark.parametrize(
    "role, subject",
    [
        (
            "gpu-offload-user-server",
            {"kind": "ServiceAccount", "name": "gpu-offload-user-server", "namespace": "jhub-bob"},
        ),
        (
            "gpu-offload-user-server",
            {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"},
        ),
        ("gpu-offload-user-server", {"kind": "ServiceAccount", "name": "default", "namespace": "jhub-alice"}),
        (
            "gpu-offload-user-namespace",
            {"kind": "ServiceAccount", "name": "gpu-offload-user-server", "namespace": "jhub-alice"},
        ),
        (
            "gpu-offload-user-namespace",
            {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"},
        ),
    ],
    ids=[
        "server role to another namespace",
        "to every user",
        "to the default account",
        "hub role to the server",
        "to a user",
    ],
)
def test_bindings_to_anyone_else_are_denied(
    policy: dict[str, Any], role: str, subject: dict[str, str]
) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "sneaky", "namespace": "jhub-alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    }
    allowed, message = admit(policy, create("rolebindings", binding), binding, ALICE)
    assert not allowed
    assert "users' server account of the same namespace" in message


def test_a_custom_prefix_reaches_the_policy(kit: Any) -> None:
    custom = kit.find(
        kit.render({"userNamespaces": {"prefix": "lab-"}}),
        "ValidatingAdmissionPolicy",
        "gpu-offload-hub-user-namespaces",
    )
    lab = namespace("lab-alice", {USER_LABEL: "true", ENFORCE: "restricted"})
    assert admit(custom, create("namespaces", lab), lab, None)[0]
    assert not admit(custom, create("namespaces", ALICE), ALICE, None)[0]


# --- Pod Security on user namespaces ------------------------------------------------------------------


@pytest.mark.parametrize("level, allowed", [("restricted", True), ("baseline", True), ("privileged", False), (None, False)])
def test_the_hub_creates_user_namespaces_only_with_a_pod_security_level(
    policy: dict[str, Any], level: str | None, allowed: bool
) -> None:
    labels = {USER_LABEL: "true", **({ENFORCE: level} if level else {})}
    ns = namespace("jhub-alice", labels)
    verdict, message = admit(policy, create("namespaces", ns), ns, None)
    assert verdict is allowed
    if not allowed:
        assert ENFORCE in message and "restricted, baseline" in message


def test_the_spawner_hooks_namespace_is_admitted(kit: Any, policy: dict[str, Any]) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner import user_namespace as un

    config = parse_config(kit.config_of(kit.render()))
    ns = un.namespace("jhub-alice", {}, "alice@example.org", config.user_namespaces.pod_security)
    assert admit(policy, create("namespaces", ns), ns, None) == (True, "")


def _update(obj: dict[str, Any], user: str = "kubernetes-admin") -> dict[str, Any]:
    return {**create("namespaces", obj, user), "operation": "UPDATE"}


@pytest.fixture(scope="module")
def keep_labels(kit: Any) -> dict[str, Any]:
    return kit.find(kit.render(), "ValidatingAdmissionPolicy", "gpu-offload-user-namespace-labels")


OWNED = {**ALICE, "metadata": {**ALICE["metadata"], "annotations": {"gpu-offload.io/user": "alice"}}}


def _relabel(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": "jhub-alice", "labels": labels, "annotations": annotations or {"gpu-offload.io/user": "alice"}}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


@pytest.mark.parametrize(
    "labels, annotations, words",
    [
        ({USER_LABEL: "true"}, None, [ENFORCE, "keeps the labels"]),
        ({USER_LABEL: "true", ENFORCE: "privileged"}, None, [ENFORCE, "userNamespaces.podSecurity"]),
        ({ENFORCE: "baseline"}, None, [USER_LABEL]),
        ({USER_LABEL: "true", ENFORCE: "baseline"}, {"gpu-offload.io/user": "mallory"}, ["bills the runs"]),
        ({USER_LABEL: "true", ENFORCE: "baseline"}, {"other": "x"}, ["bills the runs"]),
    ],
    ids=["level removed", "level privileged", "user-namespace label removed", "owner changed", "owner removed"],
)
def test_a_user_namespace_keeps_its_level_and_its_owner_whoever_updates_it(
    keep_labels: dict[str, Any], labels: dict[str, str], annotations: dict[str, str] | None, words: list[str]
) -> None:
    changed = _relabel(labels, annotations)
    allowed, message = admit(keep_labels, _update(changed), changed, None, old=OWNED)
    assert not allowed
    assert all(w in message for w in words), message


def test_other_namespace_updates_pass(keep_labels: dict[str, Any]) -> None:
    stricter = _relabel({**ALICE["metadata"]["labels"], ENFORCE: "restricted", "team": "ml"})
    assert admit(keep_labels, _update(stricter), stricter, None, old=OWNED) == (True, "")
    plain = namespace("team-x", {"a": "b"})
    assert admit(keep_labels, _update(plain), plain, None, old=namespace("team-x"))[0]


def test_a_restricted_chart_refuses_lowering_a_namespace_to_baseline(kit: Any) -> None:
    strict = kit.find(kit.render({"userNamespaces": {"podSecurity": "restricted"}}), "ValidatingAdmissionPolicy",
                      "gpu-offload-user-namespace-labels")
    old = _relabel({USER_LABEL: "true", ENFORCE: "restricted"})
    lowered = _relabel({USER_LABEL: "true", ENFORCE: "baseline"})
    assert not admit(strict, _update(lowered), lowered, None, old=old)[0]


# --- what users' servers may create -------------------------------------------------------------------

ALICE_SERVER = "system:serviceaccount:jhub-alice:gpu-offload-user-server"


@pytest.fixture(scope="module")
def servers(kit: Any) -> dict[str, Any]:
    values = {"offload": {"allowedImages": ["python:3.11-slim", "ghcr.io/lab/*"]}}
    return kit.find(kit.render(values), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")


def _request(resource: str, obj: dict[str, Any], user: str = ALICE_SERVER) -> dict[str, Any]:
    group = "batch" if resource == "jobs" else ""
    return {"operation": "CREATE", "userInfo": {"username": user},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "namespace": "jhub-alice", "name": obj["metadata"]["name"]}


def runner_pod(image: str = "python:3.11-slim") -> dict[str, Any]:
    from gpu_offload.liqo_peering.specs import RunnerPodSpec
    from gpu_offload.liqo_peering.specs import runner_pod as build

    return build(RunnerPodSpec(run_id="r1", namespace="jhub-alice", image=image, user="alice", kernel="k1",
                               scheduling={"resources": {"limits": {"nvidia.com/gpu": 1}}}))


def _job(pod_spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Job of pods with ``pod_spec`` (and ``labels`` on its template, as a rank Job's carry the runner's)."""
    template: dict[str, Any] = {"spec": pod_spec}
    if labels is not None:
        template["metadata"] = {"labels": labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dist-1"}, "spec": {"template": template}}


def _with(change: Any) -> dict[str, Any]:
    pod = runner_pod()
    change(pod["spec"])
    return pod


ESCAPES = {
    "privileged": lambda s: s["containers"][0]["securityContext"].update(privileged=True),
    "host network": lambda s: s.update(hostNetwork=True),
    "host pid": lambda s: s.update(hostPID=True),
    "host path": lambda s: s["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
    "host port": lambda s: s["containers"][0].update(ports=[{"containerPort": 22, "hostPort": 22}]),
    "privileged init container": lambda s: s.update(initContainers=[
        {"name": "init", "image": "python:3.11-slim", "securityContext": {"privileged": True}}]),
    "image not allowed": lambda s: s["containers"][0].update(image="evil/miner:latest"),
}

EXPECTED = {"privileged": "privileged containers", "host network": "network, process or IPC",
            "host pid": "network, process or IPC", "host path": "hostPath", "host port": "host ports",
            "privileged init container": "privileged containers", "image not allowed": "allowedImages"}


def test_the_runner_pods_and_jobs_the_project_creates_are_admitted(servers: dict[str, Any]) -> None:
    assert admit(servers, _request("pods", runner_pod()), runner_pod(), ALICE) == (True, "")
    lab = runner_pod("ghcr.io/lab/torch:2.13")
    assert admit(servers, _request("pods", lab), lab, ALICE) == (True, "")
    job = _job(runner_pod()["spec"])
    assert admit(servers, _request("jobs", job), job, ALICE) == (True, "")


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_users_server_cannot_create_a_pod_or_job_that_escapes(servers: dict[str, Any], escape: str) -> None:
    pod = _with(ESCAPES[escape])
    allowed, message = admit(servers, _request("pods", pod), pod, ALICE)
    assert not allowed and EXPECTED[escape] in message, message
    job = _job(pod["spec"])
    assert not admit(servers, _request("jobs", job), job, ALICE)[0]
    # the hub (kubespawner starting the user's server) and admins are judged by Pod Security, not by this
    assert admit(servers, _request("pods", pod, user=HUB_USER), pod, ALICE)[0]


def test_the_image_list_names_the_allowed_images_and_is_off_when_empty(kit: Any, servers: dict[str, Any]) -> None:
    pod = _with(ESCAPES["image not allowed"])
    message = admit(servers, _request("pods", pod), pod, ALICE)[1]
    assert "offload.allowedImages" in message and "ghcr.io/lab/*" in message
    anything = kit.find(kit.render(), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    assert admit(anything, _request("pods", pod), pod, ALICE) == (True, "")


def _service(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "dist-1"},
            "spec": {"selector": {"run": "r1"}, "ports": [{"port": 29500}], **spec}}


@pytest.mark.parametrize(
    "spec, allowed",
    [
        ({"clusterIP": "None"}, True),
        ({"clusterIP": "None", "type": "ClusterIP"}, True),
        ({}, False),
        ({"type": "NodePort"}, False),
        ({"type": "LoadBalancer"}, False),
        ({"clusterIP": "None", "externalIPs": ["203.0.113.7"]}, False),
    ],
    ids=["headless", "headless, explicit type", "cluster ip", "node port", "load balancer", "external ips"],
)
def test_a_users_server_may_create_headless_services_only(
    servers: dict[str, Any], spec: dict[str, Any], allowed: bool
) -> None:
    service = _service(**spec)
    verdict, message = admit(servers, _request("services", service), service, ALICE)
    assert verdict is allowed, message
    if not allowed:
        assert "headless Services" in message


def kueue_webhook(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as a ValidatingAdmissionPolicy sees it: after Kueue's mutating webhook (emulated by the sandbox),
    which gates a pod with the queue label unless a Job owns it (Kueue's default namespace selector matches
    user namespaces)."""
    from gpu_offload.sandbox.kueue.webhook import mutate_pod

    meta = pod["metadata"]
    owned = any(r.get("kind") == "Job" and r.get("apiVersion") == "batch/v1" for r in meta.get("ownerReferences") or [])
    if "kueue.x-k8s.io/queue-name" in (meta.get("labels") or {}) and not owned:
        mutate_pod(pod)
    return pod


def _queued_pod(**labels: str) -> dict[str, Any]:
    pod = runner_pod()
    pod["metadata"]["labels"].update(labels)
    return kueue_webhook(pod)


def test_with_queueing_on_a_users_server_may_only_create_pods_that_wait_in_its_queue(kit: Any) -> None:
    values = {"queueing": {"kueue": {"enabled": True, "localQueue": "gpus"}}}
    queued = kit.find(kit.render(values), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    ok = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus", "kueue.x-k8s.io/priority-class": "batch"})
    assert admit(queued, _request("pods", ok), ok, ALICE) == (True, "")
    no_class = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus"})  # Kueue's default priority then
    assert admit(queued, _request("pods", no_class), no_class, ALICE) == (True, "")
    for bypass in (runner_pod(), _queued_pod(**{"kueue.x-k8s.io/queue-name": "other"}),
                   _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus", "kueue.x-k8s.io/priority-class": "vip"})):
        allowed, message = admit(queued, _request("pods", bypass), bypass, ALICE)
        assert not allowed and "kueue.x-k8s.io/queue-name=gpus" in message and "interactive, batch" in message
    # a Metaflow step's Job is held to the same (Kueue's Job integration gates it by the same labels)
    queued_job = _job(ok["spec"])
    queued_job["metadata"]["labels"] = dict(ok["metadata"]["labels"])
    assert admit(queued, _request("jobs", queued_job), queued_job, ALICE) == (True, "")
    bypass_job = _job(ok["spec"])
    allowed, message = admit(queued, _request("jobs", bypass_job), bypass_job, ALICE)
    assert not allowed and "pods and Jobs that wait in its LocalQueue" in message
    # a protected session's pod starts at the class the hub adds for it (seen refused on the real Liqo pair: the
    # quickstart's session could not start); with the protection off that class is nobody's
    protected = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus", "kueue.x-k8s.io/priority-class": "session-protected"})
    assert admit(queued, _request("pods", protected), protected, ALICE) == (True, "")
    unprotected = kit.find(kit.render({"queueing": {"kueue": {**values["queueing"]["kueue"], "sessionProtection": 0}}}),
                           "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    allowed, message = admit(unprotected, _request("pods", protected), protected, ALICE)
    assert not allowed and "priority classes interactive, batch (label" in message, message
    # queueing off: the labels are not asked for
    servers = kit.find(kit.render(), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    assert admit(servers, _request("pods", runner_pod()), runner_pod(), ALICE) == (True, "")


def _rank_objects(**pod: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    from gpu_offload.liqo_peering.rankjob import RankJobSpec, master_service, rank_job
    from gpu_offload.liqo_peering.specs import RunnerPodSpec

    spec = RankJobSpec(RunnerPodSpec(run_id="r1", namespace="jhub-alice", image="python:3.11-slim", user="alice",
                                     kernel="k1", scheduling={"resources": {"limits": {"nvidia.com/gpu": 1}}}, **pod),
                       nodes=2, procs_per_node=1, master_port=23456)
    return rank_job(spec), master_service(spec, "job-uid")


def test_the_job_and_service_of_a_distributed_run_are_admitted_and_queue_with_kueue(
        kit: Any, servers: dict[str, Any]) -> None:
    job, service = _rank_objects()
    assert admit(servers, _request("jobs", job), job, ALICE) == (True, "")
    assert admit(servers, _request("services", service), service, ALICE) == (True, "")
    queued = kit.find(kit.render({"queueing": {"kueue": {"enabled": True, "localQueue": "gpus"}}}),
                      "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    waiting, _ = _rank_objects(queue="gpus", priority_class="batch")
    assert admit(queued, _request("jobs", waiting), waiting, ALICE) == (True, "")
    # a Job without the queue label would run its pods past Kueue (they are the job controller's, not judged)
    allowed, message = admit(queued, _request("jobs", job), job, ALICE)
    assert not allowed and "pods and Jobs that wait in its LocalQueue" in message

# --- which priority classes a user may name -----------------------------------------------------------------

RESTRICTED = {"queueing": {"kueue": {"enabled": True, "priorityClasses": [
    {"name": "interactive", "value": 1000}, {"name": "batch", "value": 100},
    {"name": "urgent", "value": 5000, "users": ["alice"], "groups": ["ml-leads"]}]}}}


def test_a_priority_class_kept_for_some_users_is_refused_to_the_others(kit: Any) -> None:
    from gpu_offload.hub_extension.config import parse_config
    from gpu_offload.hub_extension.spawner import user_namespace as un

    objects = kit.render(RESTRICTED)
    policy = kit.find(objects, "ValidatingAdmissionPolicy", "gpu-offload-priority-classes")
    binding = kit.find(objects, "ValidatingAdmissionPolicyBinding", "gpu-offload-priority-classes")
    # the parameter is the ConfigMap of the request's own namespace, which the spawner hook writes
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert binding["spec"]["paramRef"] == {"name": un.PRIORITY_CLASSES_NAME, "parameterNotFoundAction": "Deny"}
    # and only there: Kubernetes resolves a binding's parameter before the policy's match conditions, so a binding
    # for every namespace denied each pod of a namespace without that ConfigMap, the hub's own among them
    assert binding["spec"]["matchResources"] == {"namespaceSelector": {"matchLabels": {un.USER_NAMESPACE_LABEL: "true"}}}
    config = parse_config(kit.config_of(objects))  # the chart's values, as the hub reads them

    def params(user: str, groups: tuple[str, ...] = ()) -> Any:
        return un.priority_classes(f"jhub-{user}", config, user, groups)

    urgent = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpu-offload", "kueue.x-k8s.io/priority-class": "urgent"})
    request = _request("pods", urgent)
    assert admit(policy, request, urgent, ALICE, params=params("alice")) == (True, "")
    assert admit(policy, request, urgent, ALICE, params=params("carol", ("ml-leads",))) == (True, "")
    allowed, message = admit(policy, request, urgent, ALICE, params=params("bob", ("physics",)))
    assert not allowed and message.startswith("priority class urgent is not one this user may use"), message
    assert "queueing.kueue.priorityClasses" in message
    # the open classes stay open to everyone, a Job (a Metaflow step) is judged the same, and a pod naming no
    # class is not judged here (the queue's default applies)
    batch = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpu-offload", "kueue.x-k8s.io/priority-class": "batch"})
    assert admit(policy, _request("pods", batch), batch, ALICE, params=params("bob")) == (True, "")
    job = _job(urgent["spec"])
    job["metadata"]["labels"] = dict(urgent["metadata"]["labels"])
    assert not admit(policy, _request("jobs", job), job, ALICE, params=params("bob"))[0]
    plain = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpu-offload"})
    assert admit(policy, _request("pods", plain), plain, ALICE, params=params("bob"))[1] == "not judged: another requester"
    # the hub itself is not judged by it
    assert admit(policy, _request("pods", urgent, user=HUB_USER), urgent, ALICE, params=params("bob"))[0]
    # queueing off: no such policy
    assert not [o for o in kit.render() if o["metadata"]["name"] == "gpu-offload-priority-classes"]


def test_the_default_class_must_be_open_to_everyone(kit: Any) -> None:
    closed = {"queueing": {"kueue": {"enabled": True, "defaultPriority": "urgent", "priorityClasses": [
        {"name": "interactive", "value": 1000}, {"name": "urgent", "value": 5000, "groups": ["ml-leads"]}]}}}
    with pytest.raises(Exception, match="defaultPriority=urgent is open to some users only"):
        kit.render(closed)


# --- issue 20: a user's own pod may not skip the queue, name a PriorityClass, take GPUs through the runtime's
# environment, or leave the trusted clusters when the chart makes trusted-only a policy -------------------------

QUEUEING = {"queueing": {"kueue": {"enabled": True, "localQueue": "gpus"}}}
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "any-job", "uid": "0c5f2a6e", "controller": True}


def test_a_pod_owned_by_a_job_is_refused_it_would_get_no_kueue_workload(kit: Any, servers: dict[str, Any]) -> None:
    queued = kit.find(kit.render(QUEUEING), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    pod = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus"})
    assert admit(queued, _request("pods", pod), pod, ALICE) == (True, "")
    owned = runner_pod()
    owned["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "gpus"
    owned["metadata"]["ownerReferences"] = [JOB_OWNER]
    owned = kueue_webhook(owned)
    assert "schedulingGates" not in owned["spec"]  # Kueue leaves it to its Job's Workload: none exists
    allowed, message = admit(queued, _request("pods", owned), owned, ALICE)
    assert not allowed and "ownerReferences" in message and "skip the queue" in message, message
    # queueing off too: an ownerReference to a Job lets a pod pass for the job controller's
    plain = runner_pod()
    plain["metadata"]["ownerReferences"] = [JOB_OWNER]
    assert not admit(servers, _request("pods", plain), plain, ALICE)[0]


def test_a_pod_or_job_bound_by_its_creator_is_refused(servers: dict[str, Any]) -> None:
    pod = _with(lambda s: s.update(nodeName="donor-1-gpu"))
    allowed, message = admit(servers, _request("pods", pod), pod, ALICE)
    assert not allowed and "spec.nodeName" in message, message
    job = _job(pod["spec"])
    assert not admit(servers, _request("jobs", job), job, ALICE)[0]


def test_with_queueing_on_a_pod_kueue_did_not_gate_is_refused(kit: Any) -> None:
    queued = kit.find(kit.render(QUEUEING), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    # the queue label, but Kueue's webhook did not act (its pod integration off, or the namespace outside its
    # managedJobsNamespaceSelector): nothing would hold the pod until Kueue admits it
    ungated = runner_pod()
    ungated["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "gpus"
    allowed, message = admit(queued, _request("pods", ungated), ungated, ALICE)
    assert not allowed and "kueue.x-k8s.io/admission" in message and "managedJobsNamespaceSelector" in message
    assert admit(queued, _request("pods", kueue_webhook(ungated)), ungated, ALICE) == (True, "")


def test_a_priority_class_name_is_refused_unless_the_admin_allows_it(kit: Any, servers: dict[str, Any]) -> None:
    pod = _with(lambda s: s.update(priorityClassName="system-cluster-critical"))
    allowed, message = admit(servers, _request("pods", pod), pod, ALICE)
    assert not allowed and "priorityClassName" in message and "userServer.allowedPriorityClasses" in message
    assert not admit(servers, _request("jobs", _job(pod["spec"])), _job(pod["spec"]), ALICE)[0]
    queued = kit.find(kit.render(QUEUEING), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    labelled = _queued_pod(**{"kueue.x-k8s.io/queue-name": "gpus"})
    labelled["spec"]["priorityClassName"] = "high"  # Kueue would order it by this class: no priority label
    assert not admit(queued, _request("pods", labelled), labelled, ALICE)[0]
    listed = kit.find(kit.render({"userServer": {"allowedPriorityClasses": ["cluster-default"]}}),
                      "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    default = _with(lambda s: s.update(priorityClassName="cluster-default"))
    assert admit(listed, _request("pods", default), default, ALICE) == (True, "")
    assert not admit(listed, _request("pods", pod), pod, ALICE)[0]


def _cpu_container(**fields: Any) -> dict[str, Any]:
    return {"name": "helper", "image": "python:3.11-slim", "command": ["sleep", "1"], **fields}


NVIDIA_ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
GPU_ENV_ESCAPES = {
    "env of a pod without GPUs": lambda s: (s["containers"][0].update(resources={}, env=[NVIDIA_ALL])),
    "env of a sidecar beside a GPU": lambda s: s.update(initContainers=[
        _cpu_container(restartPolicy="Always", env=[NVIDIA_ALL])]),
    "env of a second container": lambda s: s["containers"].append(_cpu_container(env=[NVIDIA_ALL])),
    "envFrom without a prefix": lambda s: s["containers"].append(_cpu_container(
        envFrom=[{"secretRef": {"name": "mine"}}])),
    "envFrom with a prefix that can spell it": lambda s: s["containers"].append(_cpu_container(
        envFrom=[{"configMapRef": {"name": "mine"}, "prefix": "NVIDIA_"}])),
}


@pytest.mark.parametrize("escape", sorted(GPU_ENV_ESCAPES))
def test_nvidia_visible_devices_is_refused_in_containers_that_ask_for_no_gpu(
        servers: dict[str, Any], escape: str) -> None:
    pod = _with(GPU_ENV_ESCAPES[escape])
    allowed, message = admit(servers, _request("pods", pod), pod, ALICE)
    assert not allowed and "NVIDIA_VISIBLE_DEVICES" in message, message
    assert not admit(servers, _request("jobs", _job(pod["spec"])), _job(pod["spec"]), ALICE)[0]


def test_other_environments_of_gpu_less_containers_pass(servers: dict[str, Any]) -> None:
    pod = _with(lambda s: s["containers"].append(_cpu_container(
        env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
        envFrom=[{"configMapRef": {"name": "settings"}, "prefix": "APP_"}])))
    assert admit(servers, _request("pods", pod), pod, ALICE) == (True, "")


TRUSTED_ONLY = {"offload": {"trustedOnly": True},
                "clusters": {"donor-2": {"trusted": True}, "donor-3": {"trusted": True}, "donor-1": {"gpuModel": "A100"}}}


def _pinned(cluster: str | list[str]) -> dict[str, Any]:
    from gpu_offload.liqo_peering.placement import scheduling_fragment
    from gpu_offload.liqo_peering.specs import RunnerPodSpec
    from gpu_offload.liqo_peering.specs import runner_pod as build

    return build(RunnerPodSpec(run_id="r1", namespace="jhub-alice", image="python:3.11-slim", user="alice",
                               kernel="k1", scheduling=scheduling_fragment(cluster, 1)))


def _placed_runner_pod() -> dict[str, Any]:
    return _pinned(["donor-1", "donor-2"])


def _step_job(labels: dict[str, str], node_selector: dict[str, str], tolerations: list[dict[str, str]],
              **spec: Any) -> dict[str, Any]:
    """A Job as Metaflow's @kubernetes writes it for a step (labels and node selector on the pod template)."""
    pod_spec = {"containers": [{"name": "main", "image": "python:3.11-slim"}], "restartPolicy": "Never",
                "nodeSelector": node_selector, "tolerations": tolerations, **spec}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "step-1"},
            "spec": {"template": {"metadata": {"labels": labels}, "spec": pod_spec}}}


LIQO_TOLERATION = {"key": "virtual-node.liqo.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}
PROJECT = {"gpu-offload.io/managed-by": "gpu-offload"}
VIRTUAL = {"liqo.io/type": "virtual-node"}


def test_the_projects_placed_pods_jobs_and_steps_may_opt_in_to_virtual_nodes(servers: dict[str, Any]) -> None:
    from gpu_offload.flows.kubernetes_args import LIQO_TOLERATION as STEP_TOLERATION
    from gpu_offload.liqo_peering.placement import scheduling_fragment
    from gpu_offload.liqo_peering.rankjob import RankJobSpec, rank_job
    from gpu_offload.liqo_peering.specs import RunnerPodSpec

    pod = _placed_runner_pod()
    assert admit(servers, _request("pods", pod), pod, ALICE) == (True, "")
    ranks = rank_job(RankJobSpec(RunnerPodSpec(run_id="r3", namespace="jhub-alice", image="python:3.11-slim",
                                               user="alice", kernel="k1", scheduling=scheduling_fragment("donor-1", 1)),
                                 nodes=2, procs_per_node=1, master_port=29500))
    assert admit(servers, _request("jobs", ranks), ranks, ALICE) == (True, "")
    step = _step_job({**PROJECT, "gpu-offload.io/step": "train"}, {**VIRTUAL, "liqo.io/remote-cluster-id": "donor-1"},
                     [dict(STEP_TOLERATION)])
    assert admit(servers, _request("jobs", step), step, ALICE) == (True, "")


OPT_INS = {
    "a Metaflow step without @gpu_offload": _step_job({"app": "metaflow"}, {}, [LIQO_TOLERATION]),
    "a Dask worker tolerating every taint": _step_job({"app": "dask"}, {}, [{"operator": "Exists"}]),
    "the toleration by value": _step_job({}, {}, [{"key": "virtual-node.liqo.io/not-allowed", "value": "true"}]),
    "Liqo's RuntimeClass, even with the project's label": _step_job(PROJECT, VIRTUAL, [], runtimeClassName="liqo"),
    "the project's label without the placement": _step_job(PROJECT, {}, [LIQO_TOLERATION]),
    "the placement without the project's label": _step_job({}, VIRTUAL, [LIQO_TOLERATION]),
}


@pytest.mark.parametrize("case", sorted(OPT_INS))
def test_a_users_server_cannot_send_any_other_pod_to_a_virtual_node(servers: dict[str, Any], case: str) -> None:
    job = OPT_INS[case]
    allowed, message = admit(servers, _request("jobs", job), job, ALICE)
    assert not allowed and "virtual-node.liqo.io/not-allowed" in message, message
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **job["spec"]["template"]["metadata"]},
           "spec": job["spec"]["template"]["spec"]}
    assert not admit(servers, _request("pods", pod), pod, ALICE)[0]


def test_tolerations_that_do_not_reach_virtual_nodes_pass(servers: dict[str, Any]) -> None:
    for toleration in ({"operator": "Exists", "effect": "NoSchedule"},
                       {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                       {"key": "virtual-node.liqo.io/not-allowed", "value": "false"}):
        job = _step_job({"app": "dask"}, {}, [toleration])
        assert admit(servers, _request("jobs", job), job, ALICE) == (True, ""), toleration


def test_with_trusted_only_a_pod_or_job_may_name_trusted_clusters_only(kit: Any) -> None:
    policy = kit.find(kit.render(TRUSTED_ONLY), "ValidatingAdmissionPolicy", "gpu-offload-user-servers")
    by_selector = _pinned("donor-2")
    del by_selector["spec"]["affinity"]
    by_selector["spec"]["nodeSelector"] = {"liqo.io/type": "virtual-node", "liqo.io/remote-cluster-id": "donor-2"}
    # naming no cluster is fine: the namespace is offloaded to trusted donors only, and another donor's virtual
    # kubelet runs none of its pods (a queued runner pod; a Metaflow step whose donor Kueue picks)
    unnamed = _pinned("donor-2")
    del unnamed["spec"]["affinity"]
    unnamed["spec"]["nodeSelector"] = {"liqo.io/type": "virtual-node"}
    for good in (_pinned("donor-2"), _pinned(["donor-2", "donor-3"]), by_selector, unnamed, runner_pod()):
        assert admit(policy, _request("pods", good), good, ALICE) == (True, ""), good["spec"]
        job = _job(good["spec"], good["metadata"]["labels"])
        assert admit(policy, _request("jobs", job), job, ALICE) == (True, "")

    def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
        return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]  # type: ignore[no-any-return]

    escapes = {"an untrusted donor": _pinned("donor-1"), "a trusted and an untrusted donor": _pinned(["donor-2", "donor-1"]),
               "a second term naming an untrusted donor": _pinned("donor-2"), "every donor but a trusted one":
               _pinned("donor-2"), "an untrusted nodeSelector": dict(by_selector, spec=dict(by_selector["spec"])),
               "an untrusted preference": _pinned("donor-2")}
    terms(escapes["a second term naming an untrusted donor"]).append(terms(_pinned("donor-1"))[0])
    terms(escapes["every donor but a trusted one"])[0]["matchExpressions"][0]["operator"] = "NotIn"
    escapes["an untrusted nodeSelector"]["spec"]["nodeSelector"] = {"liqo.io/remote-cluster-id": "donor-1"}
    escapes["an untrusted preference"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [
        {"weight": 100, "preference": terms(_pinned("donor-1"))[0]}]
    for what, pod in escapes.items():
        allowed, message = admit(policy, _request("pods", pod), pod, ALICE)
        assert not allowed, what
        assert "offload.trustedOnly" in message and "donor-2, donor-3" in message, message
        assert not admit(policy, _request("jobs", _job(pod["spec"])), _job(pod["spec"]), ALICE)[0], what
    # without the policy, where a pod goes is the user's choice (their kernel's --trusted-only)
    open_chart = kit.find(kit.render({"clusters": TRUSTED_ONLY["clusters"]}), "ValidatingAdmissionPolicy",
                          "gpu-offload-user-servers")
    assert admit(open_chart, _request("pods", _pinned("donor-1")), _pinned("donor-1"), ALICE) == (True, "")


def test_with_trusted_only_and_no_trusted_cluster_no_pod_may_name_a_cluster(kit: Any) -> None:
    policy = kit.find(kit.render({"offload": {"trustedOnly": True}}), "ValidatingAdmissionPolicy",
                      "gpu-offload-user-servers")
    allowed, message = admit(policy, _request("pods", _pinned("donor-1")), _pinned("donor-1"), ALICE)
    assert not allowed and "no cluster is trusted" in message and "clusters.<id>.trusted" in message, message
