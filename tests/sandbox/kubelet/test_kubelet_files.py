"""What a container sees: environment, files, paths and interpreter, built by the test kubelet's pure parts
and checked by running real local processes."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest
from gpu_offload.sandbox.kubelet import images, launch, podfiles

pytestmark = pytest.mark.e2e  # starts processes: the end-to-end lane

SECRET = {"data": {"token": base64.b64encode(b"s3cr3t").decode(), "cfg": base64.b64encode(b"a=1\n").decode()}}
CONFIG = {"data": {"mode": "fast", "level": "3"}}


def lookup(kind: str, name: str):
    return {("secrets", "creds"): SECRET, ("configmaps", "settings"): CONFIG}.get((kind, name))


CTX = podfiles.PodContext("team-a", "job-1", "uid-1", "donor-1-gpu", "default", "127.10.0.7", "127.0.2.1",
                          {"app": "x"}, {})


@pytest.fixture(scope="module")
def image_map(tmp_path_factory) -> images.Images:
    return images.Images(tmp_path_factory.mktemp("state"))


def test_env_resolves_values_secrets_configmaps_downward_api_and_envfrom():
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "PLAIN", "value": "v-$(CFG_mode)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": True}}},
        ],
    }
    env = podfiles.container_env({}, container, CTX, lookup)
    assert env == {"CFG_mode": "fast", "CFG_level": "3", "PLAIN": "v-fast", "TOKEN": "s3cr3t", "LEVEL": "3",
                   "POD_IP": "127.10.0.7", "HOST_IP": "127.0.2.1", "NODE": "donor-1-gpu", "SA": "default",
                   "APP": "x", "NS": "team-a"}


def test_missing_secret_or_key_is_a_config_error_naming_it():
    with pytest.raises(podfiles.ConfigError, match='secret "nope" not found in namespace "team-a"'):
        podfiles.container_env({}, {"env": [{"name": "X", "valueFrom": {
            "secretKeyRef": {"name": "nope", "key": "k"}}}]}, CTX, lookup)
    with pytest.raises(podfiles.ConfigError, match="couldn't find key missing in configmap team-a/settings"):
        podfiles.container_env({}, {"env": [{"name": "X", "valueFrom": {
            "configMapKeyRef": {"name": "settings", "key": "missing"}}}]}, CTX, lookup)


def test_volumes_are_materialized_with_items_and_modes_and_mounted_under_rootfs(tmp_path):
    pod = {"spec": {"volumes": [
        {"name": "bundle", "secret": {"secretName": "creds", "defaultMode": 0o444}},
        {"name": "conf", "configMap": {"name": "settings", "items": [{"key": "mode", "path": "sub/mode.txt"}]}},
        {"name": "scratch", "emptyDir": {}}]}}
    volumes = podfiles.materialize_volumes(pod, tmp_path, lookup)
    container = {"volumeMounts": [{"name": "bundle", "mountPath": "/gpu-offload"},
                                  {"name": "conf", "mountPath": "/etc/conf"},
                                  {"name": "scratch", "mountPath": "/scratch"}]}
    paths = podfiles.mount_volumes(container, volumes, tmp_path / "rootfs")
    assert (paths.host("/gpu-offload/token")).read_bytes() == b"s3cr3t"
    assert (paths.host("/gpu-offload/token").stat().st_mode & 0o777) == 0o444
    assert (paths.host("/etc/conf/sub/mode.txt")).read_text() == "fast"
    assert paths.host("/scratch").is_dir()
    root = tmp_path / "rootfs"
    assert paths.rewrite("/gpu-offload/runner.pyz") == f"{root}/gpu-offload/runner.pyz"
    assert paths.rewrite("--conf=/etc/conf/sub") == f"--conf={root}/etc/conf/sub"
    assert paths.rewrite("/gpu-offloader /x/gpu-offload /etc/config") == "/gpu-offloader /x/gpu-offload /etc/config"


def test_missing_volume_source_waits_and_unknown_volume_type_is_refused(tmp_path):
    with pytest.raises(podfiles.MountError, match='volume "v" : secret "later" not found'):
        podfiles.materialize_volumes({"spec": {"volumes": [{"name": "v", "secret": {"secretName": "later"}}]}},
                                     tmp_path, lookup)
    with pytest.raises(podfiles.ConfigError, match="use secret, configMap or emptyDir"):
        podfiles.materialize_volumes({"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}},
                                     tmp_path, lookup)


def _run(runtime: images.Runtime, tmp_path: Path, code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    paths = podfiles.PathMap(tmp_path / "rootfs", ())
    plan = launch.build_launch({"metadata": {"name": "p"}}, {"command": ["python3", "-c", code]}, runtime,
                               env or {}, paths)
    return subprocess.run(list(plan.argv), env=dict(plan.env), cwd=plan.cwd, capture_output=True, text=True,
                          timeout=60)


def test_stock_image_has_numpy_and_no_gpu_offload(image_map, tmp_path):
    runtime = image_map.resolve("python:3.11-slim")
    ok = _run(runtime, tmp_path, "import numpy, sys; print(numpy.__name__, sys.executable)")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("numpy ")
    missing = _run(runtime, tmp_path, "import gpu_offload")
    assert missing.returncode == 1 and "No module named 'gpu_offload'" in missing.stderr
    # even a child started from sys.executable stays in the stock interpreter
    child = _run(runtime, tmp_path, "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', "
                                    "'import gpu_offload']))")
    assert child.returncode == 1


def test_project_image_has_gpu_offload(image_map, tmp_path):
    result = _run(image_map.resolve("ghcr.io/example/jupyter-gpu-offload:0.1.0"), tmp_path,
                  "import gpu_offload.sandbox; print('ok')")
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_environment_holds_only_what_the_spec_and_runtime_give(image_map, tmp_path, monkeypatch):
    monkeypatch.setenv("HOST_ONLY_SECRET", "leak")
    result = _run(image_map.resolve("python:3.11"), tmp_path,
                  "import os, json; print(json.dumps(sorted(os.environ)))", env={"MINE": "1"})
    assert result.stdout.strip() == '["HOME", "HOSTNAME", "LANG", "MINE", "PATH"]'


def test_unknown_image_cannot_be_pulled_and_says_how_to_fix(image_map):
    with pytest.raises(images.ImageError, match='Failed to pull image "registry.invalid/nope:1".*add a map entry'):
        image_map.resolve("registry.invalid/nope:1")


def test_command_not_on_path_is_a_start_error(image_map, tmp_path):
    with pytest.raises(launch.StartError, match='exec: "no-such-tool": executable file not found in \\$PATH'):
        launch.build_launch({"metadata": {"name": "p"}}, {"command": ["no-such-tool"]},
                            image_map.resolve("python:3.11"), {}, podfiles.PathMap(tmp_path, ()))
