"""The donor's chart: it lints clean, every object validates against the Kubernetes schemas (strict), the labeller
runs the project's labeller on the GPU nodes, and the runtime setting it hands out is the one the labeller
reports as safe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpu-offload-donor"
KUBE_VERSION = "1.30.0"

VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "privileged access": {"labeller": {"gpuAccess": "privileged", "runtimeClassName": ""}},
    "no labeller": {"labeller": {"enabled": False}},
    "device plugin config": {"labeller": {"devicePluginConfig": {"configMap": "time-slicing", "key": "a100"}}},
}


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _objects(chart: Any, values: dict[str, Any] | None = None, name: str = "donor") -> list[dict[str, Any]]:
    manifests = chart.render(values, name=name, namespace="gpu-lending", is_install=True)
    return [d for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_chart_lints_clean_and_every_object_validates(chart: Any, variant: str) -> None:
    values = VARIANTS[variant]
    report = helm.lint(CHART, values, strict=True, namespace="gpu-lending", kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    objects = _objects(chart, values)
    assert objects
    for obj in objects:
        # SchemaNotFoundError (a kind without a schema) propagates: nothing is skipped
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def _daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return found


def test_the_labeller_runs_the_projects_labeller_on_gpu_nodes_seeing_all_gpus_unprivileged(chart: Any) -> None:
    objects = _objects(chart)
    pod = _daemonset(objects)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python3", "-m", "gpu_offload.liqo_peering.node_labeller"]
    import gpu_offload.liqo_peering.node_labeller  # noqa: F401 - the module the command names exists

    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # ignored from unprivileged pods: it would not work
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/run/nvidia-container-devices/all"]["readOnly"] is True
    assert env["GPU_OFFLOAD_RUNTIME_CONFIG"].startswith(next(p for p in mounts if p.startswith("/host/")))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["runtimeClassName"] == "nvidia"
    rules = next(o for o in objects if o["kind"] == "ClusterRole")["rules"]
    assert rules == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]

    privileged = _daemonset(_objects(chart, VARIANTS["privileged access"]))["spec"]["template"]["spec"]
    (container,) = privileged["containers"]
    assert container["securityContext"]["privileged"] is True
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]
    assert "runtimeClassName" not in privileged


def test_the_runtime_setting_handed_out_is_what_the_labeller_calls_safe(chart: Any) -> None:
    from gpu_offload.liqo_peering.gpu_labels import UNPRIVILEGED_DEVICES, runtime_labels

    (config,) = [o for o in _objects(chart) if o["kind"] == "ConfigMap"]
    assert runtime_labels(config["data"]["config.toml"]) == {UNPRIVILEGED_DEVICES: "ignored"}
    operator = yaml.safe_load(config["data"]["gpu-operator-values.yaml"])
    toolkit = {e["name"]: e["value"] for e in operator["toolkit"]["env"]}
    assert toolkit["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"] == "false"
    assert operator["devicePlugin"]["env"] == [{"name": "DEVICE_LIST_STRATEGY", "value": "volume-mounts"}]

    unsafe = {"runtime": {"acceptEnvvarWhenUnprivileged": True, "acceptVolumeMounts": True}}
    (config,) = [o for o in _objects(chart, unsafe) if o["kind"] == "ConfigMap"]
    assert runtime_labels(config["data"]["config.toml"]) == {UNPRIVILEGED_DEVICES: "accepted"}
    notes = chart.render(unsafe, name="donor", namespace="gpu-lending", is_install=True)[
        "gpu-offload-donor/templates/NOTES.txt"]
    assert "Do not lend GPUs with this setting" in notes


def test_names_follow_the_release(chart: Any) -> None:
    names = {o["metadata"]["name"] for o in _objects(chart, name="site-a")}
    assert names and all(n.startswith("site-a-gpu-offload-donor-") for n in names), names


def test_a_bad_value_is_refused_naming_it(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="/labeller/gpuAccess"):
        chart.validate_schema({"labeller": {"gpuAccess": "envvar"}})
    with pytest.raises(helm.HelmValuesError, match="/lending/podSecurity"):
        chart.validate_schema({"lending": {"podSecurity": "privileged"}})


def test_the_images_named_are_the_projects(chart: Any) -> None:
    """The images both charts name are in src/gpu_offload/images.json (the one place images are written)."""
    import json

    repo = CHART.parents[1]
    table = {i["image"]: i["role"] for i in json.loads((repo / "src" / "gpu_offload" / "images.json")
                                                       .read_text())["images"]}
    (container,) = _daemonset(_objects(chart))["spec"]["template"]["spec"]["containers"]
    assert table[container["image"]] == "hub"  # has the package, hence the labeller and nvidia-ml-py
    origin = yaml.safe_load((repo / "helm" / "gpu-offload" / "values.yaml").read_text())["jupyterhub"]
    for key, role in (("hub", "hub"), ("singleuser", "singleuser")):
        image = origin[key]["image"]
        assert table[f"{image['name']}:{image['tag']}"] == role


def test_the_labeller_reads_the_device_plugin_config_it_is_given_for_the_sharing_mode(chart: Any) -> None:
    pod = _daemonset(_objects(chart, VARIANTS["device plugin config"]))["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["GPU_OFFLOAD_DEVICE_PLUGIN_CONFIG"] == mounts["device-plugin-config"] + "/a100"
    assert {"name": "device-plugin-config", "configMap": {"name": "time-slicing"}} in pod["volumes"]
    default = _daemonset(_objects(chart))["spec"]["template"]["spec"]["containers"][0]
    assert "GPU_OFFLOAD_DEVICE_PLUGIN_CONFIG" not in {e["name"] for e in default["env"]}
