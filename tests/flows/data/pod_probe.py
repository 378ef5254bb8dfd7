"""Run inside an unpacked code package: Metaflow mutates the flow as in the step's pod; print what it got."""

import importlib
import json
import sys

sys.path.insert(0, ".")
sys.argv = ["offload_flow.py", "--datastore=s3", "--metadata=local", "--no-pylint", "check"]
flow = importlib.import_module("offload_flow").OffloadFlow
try:
    flow()
except SystemExit as exc:
    assert exc.code == 0, exc.code
found = {}
for each in flow._steps:
    k8s = next((d for d in each.decorators if d.name == "kubernetes"), None)
    if k8s is not None:
        found[each.name] = {"node_selector": k8s.attributes["node_selector"], "gpu": k8s.attributes["gpu"]}
print(json.dumps({
    "steps": found,
    "kubernetes_client_imported": "kubernetes" in sys.modules,
    "gpu_offload_from": importlib.import_module("gpu_offload.flows").__file__,
}))
