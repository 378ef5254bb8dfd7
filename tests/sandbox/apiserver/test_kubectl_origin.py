"""The origin through kubectl, as an admin or a newcomer would poke at it: kubectl 1.35, whose ``wait`` waits for
the watch's initial-events-end bookmark (in the real-cluster stage, with its built kubectl; skipped without one)."""

from __future__ import annotations

from ... import kubectl as k

pytestmark = k.MARKS

POD = """
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: python:3.11
    command: [python3, -u, -c, "import time; print('hello from the sandbox'); time.sleep(600)"]
"""


def kubectl(origin, *args: str, stdin: str | None = None) -> str:
    return k.run(origin.sandbox.kubeconfig, *args, stdin=stdin).stdout


def test_kubectl_sees_the_donors_and_runs_logs_execs_and_deletes_a_pod(origin):
    assert kubectl(origin, "get", "nodes", "-l", "liqo.io/type=virtual-node", "-o", "name").split() == [
        "node/donor-1-gpu", "node/donor-2-gpu"]
    assert kubectl(origin, "get", "foreignclusters.core.liqo.io", "-o",
                   "jsonpath={.items[*].status.role}") == "Provider Provider"
    kubectl(origin, "create", "--validate=false", "-f", "-", stdin=POD)
    kubectl(origin, "wait", "--for=jsonpath={.status.phase}=Running", "pod/hello", "--timeout=120s")
    assert "hello from the sandbox" in kubectl(origin, "logs", "hello")
    assert kubectl(origin, "exec", "hello", "--", "python3", "-c", "import os; print(os.environ['HOSTNAME'])") \
        == "hello\n"
    kubectl(origin, "delete", "pod", "hello", "--wait=true", "--timeout=60s")
    assert "hello" not in kubectl(origin, "get", "pods", "-o", "name")
