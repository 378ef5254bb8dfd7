"""Trust boundaries of the admin service (issue 13), through a real JupyterHub: every form value refused
with a 400 naming its field (never a 500), uploaded kubeconfigs that would run code or read files in the
hub pod refused with the way to make a token kubeconfig, and an accepted kubeconfig kept server-side under
a one-time token instead of being echoed to the confirmation page."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from gpu_offload.hub_extension.service.uploads import KubeconfigVault
from gpu_offload.liqo_peering.errors import InvalidRequest

BASES = {
    "resourceslice": {"cluster_id": "donor-1", "gpus": "2"},
    "label": {"cluster_id": "donor-1", "node": "donor-1-gpu", "model": "A100", "price": "2"},
    "cordon": {"cluster_id": "donor-1", "node": "donor-1-gpu"},
    "peer": {"cluster_id": "donor-3"},
}
TEXT = ["²", "٣", "a b"]
NUMBER = [*TEXT, "１", "NaN", "Infinity", "1e999", "9" * 5000, "-1"]
FIELDS = [
    ("resourceslice", "cluster_id", TEXT), ("resourceslice", "gpus", NUMBER), ("resourceslice", "name", TEXT),
    ("resourceslice", "cpu", NUMBER), ("resourceslice", "memory", NUMBER),
    ("label", "cluster_id", TEXT), ("label", "node", TEXT), ("label", "model", TEXT), ("label", "price", NUMBER),
    ("cordon", "cluster_id", TEXT), ("cordon", "node", TEXT),
    ("peer", "cluster_id", TEXT), ("peer", "kubeconfig", TEXT), ("peer", "kubeconfig_token", TEXT),
]
CASES = [(kind, field, value) for kind, field, values in FIELDS for value in values]

TOKEN_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: donor-3, cluster: {server: "https://donor-3.invalid:6443", certificate-authority-data: Q0E=}}]
users: [{name: admin, user: {token: secret-bearer-token-0123}}]
contexts: [{name: donor-3, context: {cluster: donor-3, user: admin}}]
current-context: donor-3
"""
EXEC_USER = """
      exec:
        apiVersion: client.authentication.k8s.io/v1beta1
        command: aws
        args: [eks, get-token, --cluster-name, donor-3]"""


def _with_user(user_body: str) -> str:
    return TOKEN_KUBECONFIG.replace("users: [{name: admin, user: {token: secret-bearer-token-0123}}]",
                                    f"users:\n- name: admin\n  user:{user_body}")


HOSTILE_KUBECONFIGS = {
    "exec": _with_user(EXEC_USER),
    "auth-provider": _with_user("\n      auth-provider: {name: gcp, config: {cmd-path: /usr/bin/gcloud}}"),
    "tokenFile": _with_user("\n      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
    "client-certificate": _with_user("\n      client-certificate: /etc/hub/tls.crt"),
    "client-key": _with_user("\n      client-certificate-data: Q0U=\n      client-key: /etc/hub/tls.key"),
    "certificate-authority": TOKEN_KUBECONFIG.replace("certificate-authority-data: Q0E=",
                                                      "certificate-authority: /etc/passwd"),
}


def _result(page: Any) -> str:
    found = re.search(r'id="result">(.*?)</div>', page.text, re.S)
    assert found, page.text
    return html.unescape(found.group(1))


@pytest.mark.parametrize(("kind", "field", "value"), CASES)
def test_every_form_value_is_refused_with_a_400_naming_its_field(hub: Any, kind: str, field: str,
                                                                 value: str) -> None:
    form = {**BASES[kind], field: value}
    page = hub.api("POST", f"actions/{kind}", "admin", form=form)
    assert page.status == 400, page.text
    assert re.search(rf"\b{field}\b", _result(page)), _result(page)
    if field == "kubeconfig_token":
        return  # the JSON API takes the kubeconfig itself
    answer = hub.api("POST", f"api/admin/actions/{kind}", "admin", form)
    assert answer.status == 400, answer.text
    error = answer.json()["error"]
    assert re.search(rf"\b{field}\b", error) and not error.startswith("confirm:"), error


@pytest.mark.parametrize(("form", "field"), [
    ({**BASES["cordon"], "confirm": "²"}, "confirm"),
    ({**BASES["cordon"], "gpus": "2"}, "gpus"),  # not a field of cordon: refused, not ignored
    ({**BASES["resourceslice"], "memroy": "64Gi"}, "memroy"),  # a misspelt optional field
])
def test_a_confirm_other_than_yes_and_fields_an_action_does_not_take_are_refused(hub: Any, form: dict[str, str],
                                                                                field: str) -> None:
    kind = "resourceslice" if "gpus" in form and "node" not in form else "cordon"
    page = hub.api("POST", f"actions/{kind}", "admin", form=form)
    assert page.status == 400 and re.search(rf"\b{field}\b", _result(page)), page.text


def test_a_json_body_nested_too_deeply_is_a_400(hub: Any) -> None:
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    answer = hub.api("POST", "api/admin/actions/cordon", "admin", deep)
    assert answer.status == 400 and "nests too deeply" in answer.json()["error"], answer.status


@pytest.fixture(scope="module")
def peering_hub(hub_factory: Any) -> Iterator[Any]:
    yield hub_factory(liqoctl_enabled=True)


def _liqoctl_calls(hub: Any) -> list[dict[str, Any]]:
    if not hub.liqoctl_log.exists():
        return []
    return [json.loads(line) for line in hub.liqoctl_log.read_text().splitlines()]


@pytest.mark.parametrize("key", sorted(HOSTILE_KUBECONFIGS))
def test_kubeconfigs_that_run_programs_or_read_files_are_refused_with_the_fix(peering_hub: Any, key: str) -> None:
    kubeconfig = HOSTILE_KUBECONFIGS[key]
    before = len(_liqoctl_calls(peering_hub))
    answer = peering_hub.api("POST", "api/admin/actions/peer", "admin",
                             {"cluster_id": "donor-3", "kubeconfig": kubeconfig, "confirm": True})
    assert answer.status == 400, answer.text
    error = answer.json()["error"]
    assert error.startswith("kubeconfig: ") and f".{key} " in error and "kubectl create token" in error, error
    assert "exec plugins" in error  # says why the usual cloud kubeconfigs do not work
    page = peering_hub.api("POST", "actions/peer", "admin",
                           form={"cluster_id": "donor-3", "kubeconfig": kubeconfig, "confirm": "yes"})
    assert page.status == 400 and f".{key} " in _result(page)
    assert len(_liqoctl_calls(peering_hub)) == before  # liqoctl never ran with it


def test_the_confirmation_page_carries_a_one_time_token_never_the_kubeconfig(peering_hub: Any) -> None:
    before = len(_liqoctl_calls(peering_hub))
    confirm = peering_hub.api("POST", "actions/peer", "admin",
                              form={"cluster_id": "donor-3", "kubeconfig": TOKEN_KUBECONFIG})
    assert confirm.status == 200 and "You are about to" in confirm.text
    assert "secret-bearer-token-0123" not in confirm.text and "donor-3.invalid" not in confirm.text
    assert 'name="kubeconfig"' not in confirm.text
    token = re.search(r'name="kubeconfig_token" value="([^"]+)"', confirm.text)
    assert token, confirm.text
    form = {"cluster_id": "donor-3", "kubeconfig_token": token.group(1), "confirm": "yes"}
    # bound to the action and cluster it was issued for: another cluster spends it without running anything
    other = peering_hub.api("POST", "actions/unpeer", "admin", form=form)
    assert other.status == 400 and "kubeconfig_token" in _result(other)
    assert len(_liqoctl_calls(peering_hub)) == before
    confirm = peering_hub.api("POST", "actions/peer", "admin",
                              form={"cluster_id": "donor-3", "kubeconfig": TOKEN_KUBECONFIG})
    token = re.search(r'name="kubeconfig_token" value="([^"]+)"', confirm.text)
    assert token
    form["kubeconfig_token"] = token.group(1)
    done = peering_hub.api("POST", "actions/peer", "admin", form=form)
    assert done.status == 200 and "peering established (stand-in)" in _result(done), done.text
    calls = _liqoctl_calls(peering_hub)
    assert len(calls) == before + 1 and calls[-1]["kubeconfig"].strip() == TOKEN_KUBECONFIG.strip()
    again = peering_hub.api("POST", "actions/peer", "admin", form=form)  # single use
    assert again.status == 400 and "already used or expired" in _result(again)
    assert len(_liqoctl_calls(peering_hub)) == before + 1


def test_a_held_kubeconfig_expires_and_belongs_to_its_uploader() -> None:
    now = [1000.0]
    vault = KubeconfigVault(clock=lambda: now[0], ttl=600)
    token = vault.hold("admin", "peer", "donor-3", "kc")
    with pytest.raises(InvalidRequest, match="issued to admin"):
        vault.redeem(token, "mallory", "peer", "donor-3")
    token = vault.hold("admin", "peer", "donor-3", "kc")
    now[0] += 601
    with pytest.raises(InvalidRequest, match="expired"):
        vault.redeem(token, "admin", "peer", "donor-3")
    token = vault.hold("admin", "peer", "donor-3", "kc")
    assert vault.redeem(token, "admin", "peer", "donor-3") == "kc"
