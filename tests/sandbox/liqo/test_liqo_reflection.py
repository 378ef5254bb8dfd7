"""The sandbox's Liqo reflection of Secrets and ConfigMaps follows Liqo's rules (``sandbox/reflection.py`` cites
the files of liqotech/liqo they come from): which objects go, to which donors, under which reflector type."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.reflection import (
    ALLOW_LIST,
    ReflectionTypes,
    offloaded_to,
    reflected,
    remote_name,
)

DENY = ReflectionTypes()
ALLOW = ReflectionTypes(secret=ALLOW_LIST, configmap=ALLOW_LIST)


def obj(annotations: dict[str, str] | None = None, type_: str = "Opaque") -> dict[str, Any]:
    return {"type": type_, "metadata": {"name": "s", "namespace": "ns", "annotations": annotations or {}}}


@pytest.mark.parametrize("annotations, deny_list, allow_list", [
    ({}, True, False),
    ({"liqo.io/skip-reflection": "true"}, False, False),
    ({"liqo.io/skip-reflection": ""}, False, False),  # present: skipped, whatever the value but "false"
    ({"liqo.io/skip-reflection": "FALSE"}, True, False),
    ({"liqo.io/allow-reflection": "true"}, True, True),
    ({"liqo.io/allow-reflection": "yes"}, True, True),
    ({"liqo.io/allow-reflection": "False"}, True, False),
])
def test_deny_list_and_allow_list_read_the_annotations_as_liqo_does(annotations, deny_list, allow_list) -> None:
    for kind in ("Secret", "ConfigMap"):
        assert reflected(obj(annotations), kind, DENY) is deny_list
        assert reflected(obj(annotations), kind, ALLOW) is allow_list


def test_service_account_tokens_are_never_reflected_and_the_root_ca_is_renamed() -> None:
    token = obj({"liqo.io/allow-reflection": "true"}, "kubernetes.io/service-account-token")
    assert not reflected(token, "Secret", DENY) and not reflected(token, "Secret", ALLOW)
    assert remote_name("kube-root-ca.crt", "ConfigMap") == "kube-root-ca.crt.origi"
    assert remote_name("kube-root-ca.crt", "Secret") == "kube-root-ca.crt"


def test_a_namespace_reaches_the_donors_its_selector_picks_whatever_its_pod_strategy() -> None:
    donors = liqo.donors(3)
    nodes = [liqo.virtual_node_node(d, i) for i, d in enumerate(donors)] + liqo.local_nodes()

    def nsoff(namespace: str, strategy: str, clusters: list[str] | None = None, name: str = "offloading"):
        terms = ([{"matchExpressions": [{"key": "liqo.io/remote-cluster-id", "operator": "In", "values": clusters}]}]
                 if clusters else [])
        return {"metadata": {"name": name, "namespace": namespace},
                "spec": {"podOffloadingStrategy": strategy, "clusterSelector": {"nodeSelectorTerms": terms}}}

    got = offloaded_to([nsoff("a", "Local"), nsoff("b", "LocalAndRemote", ["donor-2"]),
                        nsoff("c", "Remote", name="other")], nodes)
    # Local keeps pods home, not Secrets: the namespace is still offloaded to every selected donor
    assert got == {"a": ["donor-1", "donor-2", "donor-3"], "b": ["donor-2"]}
