"""The image manifest and the runner that follows the kernel: which runner a kernel gets by default, and which
runner images are refused before launch, with the fix in the message."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_offload import images
from gpu_offload.images import Versions

REPO = Path(__file__).resolve().parents[1]


def test_the_default_runner_has_the_kernels_python_minor_for_each_version_debian_ships() -> None:
    assert images.default_runner(Versions("3.11", "3.1.2")) == "jupyter-gpu-offload/runner:0.1.0-py3.11"
    assert images.default_runner(Versions("3.13", "3.1.2")) == "jupyter-gpu-offload/runner:0.1.0-py3.13"


def test_a_kernel_with_torch_gets_the_cuda_runner_and_a_registry_goes_in_front() -> None:
    kernel = Versions("3.13", "3.1.2", "2.13.0")
    assert images.default_runner(kernel) == "jupyter-gpu-offload/runner-cuda:0.1.0-py3.13"
    assert (images.default_runner(kernel, "registry.example.org/ml/")
            == "registry.example.org/ml/jupyter-gpu-offload/runner-cuda:0.1.0-py3.13")


def test_a_python_without_a_runner_image_is_named_with_the_ones_that_exist() -> None:
    with pytest.raises(ValueError) as err:
        images.default_runner(Versions("3.9", "3.1.2"))
    assert "Python 3.9" in str(err.value) and "3.11" in str(err.value) and "--image" in str(err.value)


def test_a_runner_of_another_python_minor_is_refused_naming_the_right_one() -> None:
    refusal = images.check_runner("jupyter-gpu-offload/runner:0.1.0-py3.13", Versions("3.11", "3.1.2"))
    assert refusal is not None
    assert "Python 3.13 (the kernel has 3.11)" in refusal
    assert "use jupyter-gpu-offload/runner:0.1.0-py3.11" in refusal and "Nothing was launched" in refusal


def test_cloudpickle_and_torch_majors_are_compared_and_a_registry_prefix_still_matches() -> None:
    image = "registry.example.org/ml/jupyter-gpu-offload/runner-cuda:0.1.0-py3.11"
    assert images.check_runner(image, Versions("3.11", "3.0.0", "2.1.0")) is None  # same majors
    refusal = images.check_runner(image, Versions("3.11", "2.2.1", "1.13.1"), "registry.example.org/ml")
    assert refusal is not None
    assert "cloudpickle 3.1.2 (the kernel has 2.2.1)" in refusal and "torch 2.13.0 (the kernel has 1.13.1)" in refusal
    assert "use registry.example.org/ml/jupyter-gpu-offload/runner-cuda:0.1.0-py3.11" in refusal


def test_images_that_declare_nothing_are_left_to_the_runners_own_check() -> None:
    assert images.check_runner("python:3.12-slim", Versions("3.11", "3.1.2")) is None
    # a name that only ends like one of ours is another image
    assert images.check_runner("evil/xjupyter-gpu-offload/runner:0.1.0-py3.13", Versions("3.11")) is None


def test_the_kernels_versions_are_read_without_importing_torch() -> None:
    import sys

    had_torch = "torch" in sys.modules
    kernel = images.kernel_versions()
    assert kernel.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
    import cloudpickle

    assert kernel.cloudpickle == cloudpickle.__version__
    assert ("torch" in sys.modules) == had_torch


def test_every_image_of_the_manifest_has_its_recipe_and_every_recipe_writes_the_declared_labels() -> None:
    table = images.manifest()
    assert {spec.role for spec in table.images} == {"hub", "singleuser", "runner", "runner-cuda"}
    for spec in table.images:
        recipe = (REPO / "images" / spec.recipe / "Dockerfile").read_text()
        assert "FROM ${BASE}" in recipe and "ARG BASE=" in recipe, spec.recipe
        if spec.role != "hub":  # the hub runs no cells: nothing to declare
            for key in table.labels.values():
                assert key in recipe, f"images/{spec.recipe}/Dockerfile does not write the label {key}"
    # the versions Debian ships are the ones built and tested here, slim and CUDA alike
    for role in ("runner", "runner-cuda"):
        assert {s.declared.python: s.debian for s in table.role(role) if s.debian} == {
            "3.11": "bookworm", "3.13": "trixie"}


def test_with_the_charts_default_the_hub_sets_no_image_and_each_kernel_picks_its_runner() -> None:
    import yaml
    from gpu_offload.hub_extension.config import HubConfig
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment

    from gpu_offload.engine.backends.kube.config import from_environment

    chart_default = yaml.safe_load((REPO / "helm" / "gpu-offload" / "values.yaml").read_text())["offload"]
    assert chart_default["defaultImage"] == ""
    env = server_environment("jhub-alice", HubConfig())
    assert "GPU_OFFLOAD_IMAGE" not in env
    assert from_environment(env).image is None  # the launcher then takes images.default_runner


def test_the_chart_names_the_hub_and_user_images_of_the_manifest() -> None:
    import yaml

    values = yaml.safe_load((REPO / "helm" / "gpu-offload" / "values.yaml").read_text())["jupyterhub"]
    named = {role: f"{values[key]['image']['name']}:{values[key]['image']['tag']}"
             for role, key in (("hub", "hub"), ("singleuser", "singleuser"))}
    assert named == {role: images.manifest().role(role)[0].image for role in ("hub", "singleuser")}


def test_the_hub_image_keeps_the_jupyterhub_of_its_z2jh_base_and_the_hub_extra_accepts_it() -> None:
    import tomllib
    from packaging.requirements import Requirement

    (hub,) = images.manifest().role("hub")
    assert hub.jupyterhub, "the hub entry names the JupyterHub its z2jh base ships"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (jupyterhub,) = [r for r in map(Requirement, extras["hub"]) if r.name == "jupyterhub"]
    # were it refused, installing the hub extra on z2jh's hub image would upgrade the hub under z2jh's configuration
    assert jupyterhub.specifier.contains(hub.jupyterhub), (jupyterhub, hub.jupyterhub)
    assert "${JUPYTERHUB:+\"jupyterhub==${JUPYTERHUB}\"}" in (REPO / "images" / "hub" / "Dockerfile").read_text()
