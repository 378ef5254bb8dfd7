"""The one settings module: every ``GPU_OFFLOAD_*`` read of the product goes through it, a bad value is named with
its fix, and every front end applies the same run defaults from the same setting."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.liqo_peering import environment as E
from gpu_offload.liqo_peering.settings import (
    KERNEL_FIELDS,
    KernelSettings,
    kernel_settings,
    read_donor,
    read_kernel,
    run_defaults,
)

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("src", "magics", "hub_extension", "liqo_peering", "flows", "sandbox")
READER = {"liqo_peering/settings.py", "liqo_peering/environment.py"}
"""The settings module, and the definitions whose ``Setting.read``/``get`` it calls."""
EXEMPT = {
    "src/gpu_offload/runner/outputs.py": "the runner runs on donors and imports nothing of the project; "
                                         "test_environment keeps its one variable spelled as defined",
    "src/gpu_offload/runner/gpu_cap.py": "the runner's cap on its part of a GPU, read on the donor; "
                                         "tests/runner/test_gpu_cap.py keeps its names spelled as defined",
    "flows/kubernetes_args.py": "looks at the @environment a user wrote for a step, not at an environment",
}
SETTINGS = {name for name in dir(E) if isinstance(getattr(E, name), E.Setting)}
VARIABLE = ("GPU_OFFLOAD_", "METAFLOW_GPU_OFFLOAD_")
LOOKUPS = {"get", "getenv", "pop", "setdefault"}


def _names_a_variable(node: ast.AST, constants: set[str]) -> bool:
    """``"GPU_OFFLOAD_X"``, ``E.X.name`` or a module constant holding one of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(VARIABLE)
    if isinstance(node, ast.Attribute) and node.attr == "name":
        inner = node.value
        return (isinstance(inner, ast.Attribute) and inner.attr in SETTINGS) or (
            isinstance(inner, ast.Name) and inner.id in SETTINGS)
    return isinstance(node, ast.Name) and node.id in constants


def _constants(trees: list[ast.Module]) -> set[str]:
    """Module-level names bound to a variable's name anywhere in the product (they travel by import)."""
    found: set[str] = set()
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and _names_a_variable(node.value, set()):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return found


def environment_reads(tree: ast.Module, constants: set[str]) -> list[int]:
    """Lines of ``tree`` that read a ``GPU_OFFLOAD_*`` variable: ``env.get(NAME)``, ``os.getenv(NAME)``,
    ``env[NAME]``, ``NAME in env``, or a setting's own ``read``/``get`` (``E.QUEUE.read(env)``)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if node.func.attr in ("read", "get") and (
                    (isinstance(target, ast.Attribute) and target.attr in SETTINGS)
                    or (isinstance(target, ast.Name) and target.id in SETTINGS)) or node.func.attr in LOOKUPS and node.args and _names_a_variable(node.args[0], constants):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            lines += [node.lineno] if _names_a_variable(node.slice, constants) else []
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            lines += [node.lineno] if _names_a_variable(node.left, constants) else []
    return lines


def test_the_finder_sees_every_shape_of_read() -> None:
    source = '''
import os
from gpu_offload.liqo_peering import environment as E
FORMAT_ENV = "GPU_OFFLOAD_OUTPUT_FORMAT"
a = os.environ.get("GPU_OFFLOAD_QUEUE")
b = E.QUEUE.read(os.environ)
c = env[E.NAMESPACE.name]
d = os.getenv(FORMAT_ENV)
e = "METAFLOW_GPU_OFFLOAD_PLACEMENT" in env
f = E.FLOW_SOURCE.get(lookup)
env[E.SERVER_ID.name] = "written, not read"
g = env.get("HOME")
'''
    tree = ast.parse(source)
    assert environment_reads(tree, _constants([tree])) == [5, 6, 7, 8, 9, 10]


def test_no_product_module_reads_a_gpu_offload_variable_but_the_settings_module() -> None:
    files = {p.relative_to(REPO).as_posix(): p for root in PRODUCT for p in (REPO / root).rglob("*.py")}
    trees = {rel: ast.parse(path.read_text(), rel) for rel, path in files.items()}
    constants = _constants(list(trees.values()))
    assert {"FORMAT_ENV", "RECORDED_ENV", "MEMORY_ENV"} <= constants  # the finder follows named constants
    found = {rel: environment_reads(tree, constants) for rel, tree in trees.items() if rel not in READER}
    outside = {rel: lines for rel, lines in found.items() if lines and rel not in EXEMPT}
    assert not outside, ("read these through gpu_offload.liqo_peering.settings (a field of KernelSettings, or a "
                         f"function beside read_kernel): {outside}")
    assert all(found[rel] for rel in EXEMPT), "an exemption no longer needed: remove it"


def test_every_kernel_variable_is_a_field_of_the_kernel_settings() -> None:
    fields = [f.name for f in dataclasses.fields(KernelSettings) if f.name != "invalid"]
    assert fields == list(KERNEL_FIELDS)
    assert [s.name for s in KERNEL_FIELDS.values()] == [s.name for s in E.KERNEL]
    assert read_kernel({}) == KernelSettings()  # unset: every field is its variable's default


def test_values_are_parsed_into_their_types() -> None:
    settings = read_kernel({"GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-1, donor-2", "GPU_OFFLOAD_METERED": "yes",
                            "GPU_OFFLOAD_MONTHLY_BUDGET": "99.5", "GPU_OFFLOAD_BACKEND": "Kubernetes",
                            "GPU_OFFLOAD_SWEEP_SECONDS": " 2.5 ", "GPU_OFFLOAD_NODE_LOST_SECONDS": "30"})
    assert settings.trusted_clusters == ("donor-1", "donor-2") and settings.metered is True
    assert settings.node_lost_seconds == 30 and read_kernel({}).node_lost_seconds == 10
    assert settings.monthly_budget == 99.5 and settings.backend == "kubernetes" and settings.sweep_seconds == 2.5
    assert settings.check() is settings


def test_a_bad_value_keeps_the_others_and_fails_only_who_needs_it_naming_the_variable_and_the_fix() -> None:
    settings = read_kernel({"GPU_OFFLOAD_MONTHLY_BUDGET": "lots", "GPU_OFFLOAD_GPU_MODEL": "A100"})
    assert settings.gpu_model == "A100" and settings.monthly_budget is None
    assert settings.problem("monthly_budget") == "GPU_OFFLOAD_MONTHLY_BUDGET='lots' is not a number; write it like 250 or 99.5"
    assert settings.check("gpu_model") is settings
    with pytest.raises(E.InvalidSetting) as err:
        settings.check("monthly_budget")
    assert str(err.value) == ("GPU_OFFLOAD_MONTHLY_BUDGET='lots' is not a number; write it like 250 or 99.5; set it "
                              "as the docs say or unset it for the default (none)")
    with pytest.raises(E.InvalidSetting, match="GPU_OFFLOAD_LABEL_INTERVAL='often' is not a number of seconds; .*"
                                               r"unset it for the default \(300\)"):
        read_donor({"GPU_OFFLOAD_LABEL_INTERVAL": "often"})
    for raw, why in (("soon", "is not a whole number of seconds; write it like 10"), ("-5", "must be 0 or more")):
        assert read_kernel({"GPU_OFFLOAD_NODE_LOST_SECONDS": raw}).problem("node_lost_seconds") == \
            f"GPU_OFFLOAD_NODE_LOST_SECONDS={raw!r} {why}"


def test_the_process_settings_follow_its_environment_and_are_parsed_once_per_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_OFFLOAD_MEMORY", "8Gi")
    first = kernel_settings()
    assert first.memory == "8Gi" and kernel_settings() is first
    monkeypatch.setenv("GPU_OFFLOAD_MEMORY", "16Gi")  # a notebook's %env: the next run sees it
    assert kernel_settings().memory == "16Gi"


HUB_ENV = {"GPU_OFFLOAD_GPU_MODEL": "A100,H100", "GPU_OFFLOAD_TRUSTED_ONLY": "1", "GPU_OFFLOAD_QUEUE": "team-q",
           "GPU_OFFLOAD_PRIORITY": "batch", "GPU_OFFLOAD_MEMORY": "32Gi", "GPU_OFFLOAD_IMAGE": "runner:3.12",
           "GPU_OFFLOAD_PLACEMENT_POLICY": "bin-pack"}
"""What a hub's spawner writes for a user's server (its terminals and kernels inherit it)."""


def test_the_run_defaults_are_the_settings_of_the_variables() -> None:
    defaults = run_defaults(read_kernel(HUB_ENV))
    assert dataclasses.asdict(defaults) == {
        "gpu_model": "A100,H100", "trusted_only": True, "queue": "team-q", "priority": "batch", "memory": "32Gi",
        "image": "runner:3.12", "placement_policy": "bin-pack"}


def _magic_request(env: dict[str, str], line: str) -> Any:
    from gpu_offload.magics.magic import GpuOffloadMagics
    from IPython.core.interactiveshell import InteractiveShell

    magic = GpuOffloadMagics(InteractiveShell.instance(), settings=read_kernel(env))
    try:
        return magic._request(line, "x = 1")
    finally:
        magic.close()


def _script_request(env: dict[str, str], *words: str) -> Any:
    import argparse

    from gpu_offload.cli import run

    parser = argparse.ArgumentParser()
    run.add_parser(parser.add_subparsers(), "run")
    args = parser.parse_args(["run", *words, "train.py"])
    return run.script_request(args, "x = 1", run_defaults(read_kernel(env)))


def test_a_cell_and_a_script_get_the_same_defaults_from_the_same_variables() -> None:
    cell, script = _magic_request(HUB_ENV, ""), _script_request(HUB_ENV)
    for request in (cell, script):
        assert (request.gpu_model, request.fallback_models, request.trusted_only) == ("A100", ("H100",), True)
    # what the line says wins in both
    cell, script = _magic_request(HUB_ENV, "--gpu-model L4"), _script_request(HUB_ENV, "--gpu-model", "L4")
    assert cell.gpu_model == script.gpu_model == "L4" and cell.fallback_models == script.fallback_models == ()
    # unset: any model, any cluster
    cell, script = _magic_request({}, ""), _script_request({})
    assert (cell.gpu_model, cell.trusted_only) == (script.gpu_model, script.trusted_only) == (None, False)


def test_the_kube_backend_and_a_metaflow_step_queue_as_the_same_variables_say() -> None:
    from gpu_offload.flows.decision import decide, queued
    from gpu_offload.flows.options import OffloadOptions
    from gpu_offload.flows.settings import read_settings

    from gpu_offload.engine.backends.kube.config import from_environment

    backend = from_environment({**HUB_ENV, "GPU_OFFLOAD_NAMESPACE": "alice", "GPU_OFFLOAD_KERNEL_ID": "k1"})
    defaults = run_defaults(read_kernel(HUB_ENV))
    assert (backend.queue, backend.priority, backend.image, backend.policy) == (
        defaults.queue, defaults.priority, defaults.image, defaults.placement_policy)
    settings = read_settings({}.get, HUB_ENV)  # no METAFLOW_GPU_OFFLOAD_* set: the hub's defaults apply
    options = OffloadOptions(gpus=1)
    step = queued(decide("train", options, settings, None, "config"), options, settings)
    assert (step.queue, step.priority) == ("team-q", "batch")
    own = read_settings({"GPU_OFFLOAD_QUEUE": "flows-q", "GPU_OFFLOAD_PRIORITY": "low"}.get, HUB_ENV)
    step = queued(decide("train", options, own, None, "config"), options, own)
    assert (step.queue, step.priority) == ("flows-q", "low")  # METAFLOW_GPU_OFFLOAD_* wins for steps


def test_what_a_metaflow_step_s_pod_gets_of_liqo_peering_imports_only_itself_and_the_standard_library() -> None:
    import sys

    from gpu_offload.flows.packaging import LIQO_DIR, LIQO_FILES

    assert "settings.py" in LIQO_FILES  # flows.settings reads through it inside the pod
    shipped = {name.removesuffix(".py") for name in LIQO_FILES}
    outside = []
    for name in LIQO_FILES:
        for node in ast.walk(ast.parse((LIQO_DIR / name).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                targets = [node.module] if node.module else [a.name for a in node.names]
                outside += [f"{name}: .{t}" for t in targets if t.split(".")[0] not in shipped]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                roots = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                outside += [f"{name}: {r}" for r in roots
                            if r.split(".")[0] not in sys.stdlib_module_names and r != "__future__"]
    assert not outside, f"the step's pod would not find these (flows/packaging.py ships {sorted(LIQO_FILES)})"


def test_a_backend_variable_that_names_no_backend_is_refused_with_the_fix_not_taken_for_local() -> None:
    from gpu_offload.engine.backends import registry
    from gpu_offload.engine.errors import BackendNotConfigured

    assert registry.auto_name({"GPU_OFFLOAD_BACKEND": "Kubernetes"}) == "kubernetes"
    assert registry.auto_name({"GPU_OFFLOAD_NAMESPACE": "alice"}) == "kubernetes"
    assert registry.auto_name({}) == "local"
    with pytest.raises(BackendNotConfigured) as err:
        registry.auto_name({"GPU_OFFLOAD_BACKEND": "k8s", "GPU_OFFLOAD_NAMESPACE": "alice"})
    assert str(err.value) == ("GPU_OFFLOAD_BACKEND='k8s' is not allowed; use one of kubernetes, local; set it as the "
                              "docs say or unset it for the default (none). Nothing was run.")
