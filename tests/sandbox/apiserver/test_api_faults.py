"""Fault rules as clients experience them: an injected 5xx is a real ``Status`` with Retry-After on the
chosen path only, limited to ``times``; latency rules delay but still serve. (Part 2 builds its fault
scenarios and control endpoint on these rules.)"""

from __future__ import annotations

import json

import pytest
from gpu_offload.sandbox.apiserver.http_faults import FaultRule
from kubernetes.client import ApiException


def test_injected_503_hits_only_the_chosen_path_and_only_times_times(api_sandbox, core, ns, pod):
    faults = api_sandbox.api.faults
    rule = faults.add(FaultRule(path=rf"/namespaces/{ns}/pods$", methods=("POST",), status=503, times=1))
    try:
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(ns, pod("a"))
        assert err.value.status == 503 and err.value.headers["Retry-After"] == "1"
        assert json.loads(err.value.body)["reason"] == "ServiceUnavailable"
        core.list_namespaced_pod(ns)  # other verbs on the path are untouched
        assert core.create_namespaced_pod(ns, pod("a")).metadata.name == "a"  # the rule ran out
        assert faults.fired(rule) == 1 and not faults.acting(rule)
    finally:
        faults.remove(rule)


def test_a_rule_acts_until_it_is_removed(api_sandbox, core, ns):
    # what the origin pool's check reads: a rule a test removed from the server is no leftover
    faults = api_sandbox.api.faults
    rule = faults.add(FaultRule(path=rf"/namespaces/{ns}/configmaps$", status=500))
    try:
        assert faults.acting(rule)
        with pytest.raises(ApiException):
            core.list_namespaced_config_map(ns)
        assert faults.acting(rule)  # no times: it acts until removed
    finally:
        faults.remove(rule)
    assert not faults.acting(rule)
    core.list_namespaced_config_map(ns)


def test_latency_rule_still_serves_the_request(api_sandbox, core, ns):
    faults = api_sandbox.api.faults
    rule = faults.add(FaultRule(path=rf"/namespaces/{ns}/configmaps", delay=0.2))
    try:
        assert core.create_namespaced_config_map(ns, {"metadata": {"name": "slow"}}).metadata.name == "slow"
        assert faults.fired(rule) == 1
    finally:
        faults.remove(rule)


def test_a_rule_that_does_nothing_is_refused():
    with pytest.raises(ValueError, match="give status"):
        FaultRule(path="/api")


def test_a_hold_rule_keeps_the_request_in_flight_until_released(api_sandbox, core, ns, pod):
    import threading

    faults = api_sandbox.api.faults
    rule = faults.add(FaultRule(path=rf"/namespaces/{ns}/pods$", methods=("POST",), delay=60, times=1, hold=True))
    created: list[str] = []
    client = threading.Thread(target=lambda: created.append(core.create_namespaced_pod(ns, pod("held")).metadata.name))
    try:
        client.start()
        deadline = 600
        while faults.fired(rule) == 0 and deadline:  # the request reached the server...
            deadline -= 1
            threading.Event().wait(0.05)
        assert faults.fired(rule) == 1
        assert core.list_namespaced_pod(ns).items == []  # ...and is held: nothing created yet
        core.create_namespaced_pod(ns, pod("meanwhile"))  # the rule fired its one time: others pass
        faults.release(rule)
        client.join(30)
        assert created == ["held"]
        assert sorted(p.metadata.name for p in core.list_namespaced_pod(ns).items) == ["held", "meanwhile"]
    finally:
        faults.remove(rule)
        client.join(30)
