"""The environment contract between processes: one definition per variable, written and read through it, and
documented exactly as defined."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_offload.liqo_peering import environment as E

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b(?:METAFLOW_)?GPU_OFFLOAD_[A-Z0-9_]*[A-Z0-9]\b")
# Spelled in code, not environment variables: the prefix the definitions are built from.
NOT_VARIABLES = {"GPU_OFFLOAD"}


def test_every_variable_the_project_spells_is_defined_once() -> None:
    defined = [s.name for s in E.ALL]
    assert len(defined) == len(set(defined))
    sources = [p for folder in ("liqo_peering", "magics", "flows", "hub_extension", "src", "helm")
               for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".yaml", ".tpl", ".json")]
    spelled = {(name, p.relative_to(REPO).as_posix()) for p in sources for name in NAME.findall(p.read_text())}
    unknown = sorted((name, where) for name, where in spelled if name not in defined)
    assert not unknown, "define these in liqo_peering/environment.py: " + repr(unknown)


def _doc_tables() -> dict[str, str]:
    """``{variable: default column}`` of every docs table whose first column holds environment variables."""
    rows: dict[str, str] = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        in_table = False
        for line in doc.read_text().splitlines():
            if not line.startswith("|"):
                in_table = False
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if "environment variable" in cells[0]:
                in_table = True
            elif in_table and not set(cells[0]) <= {"-"}:
                names = re.findall(r"`([A-Z0-9_]+)`", cells[0])
                assert len(names) == 1, f"{doc.name}: one variable per row: {line}"
                assert names[0] not in rows, f"{names[0]} is documented twice"
                rows[names[0]] = cells[1]
    return rows


def test_the_docs_tables_list_exactly_the_settings_with_their_defaults() -> None:
    documented = _doc_tables()
    defined = {s.name: s.documented_default for s in (*E.KERNEL, *E.HUB, *E.FLOW)}
    assert sorted(set(defined) - set(documented)) == [], "missing from the docs tables"
    assert sorted(set(documented) - set(defined)) == [], "documented but not defined"
    assert documented == defined


def test_the_policy_names_are_placements_own() -> None:
    from gpu_offload.liqo_peering.placement import POLICIES

    assert tuple(POLICIES) == E.POLICY_NAMES


def test_the_runner_spells_the_output_format_variable_as_defined() -> None:
    from gpu_offload.runner.outputs import FORMAT_ENV

    assert E.OUTPUT_FORMAT.name == FORMAT_ENV


def test_unset_and_blank_read_as_the_default_and_values_are_stripped() -> None:
    assert E.IMAGE.read({}) is None  # the kernel picks the runner image of its own Python
    assert E.IMAGE.read({"GPU_OFFLOAD_IMAGE": "  "}) is None
    assert E.IMAGE.read({"GPU_OFFLOAD_IMAGE": " torch:2 "}) == "torch:2"
    assert E.SWEEP_SECONDS.read({"GPU_OFFLOAD_SWEEP_SECONDS": "2.5"}) == 2.5
    assert E.METERED.read({"GPU_OFFLOAD_METERED": "Yes"}) is True
    assert E.CREATE_OFFLOADING.read({}) is None  # the reader decides: no in a hub, yes elsewhere


def test_a_bad_value_names_the_variable_the_value_and_what_to_write() -> None:
    with pytest.raises(E.InvalidSetting) as err:
        E.PLACEMENT_POLICY.read({"GPU_OFFLOAD_PLACEMENT_POLICY": "fastest"})
    assert str(err.value) == (
        "GPU_OFFLOAD_PLACEMENT_POLICY='fastest' is not allowed; use one of most-free, bin-pack, first-fit")
    with pytest.raises(E.InvalidSetting, match="GPU_OFFLOAD_SWEEP_SECONDS='soon' is not a number of seconds"):
        E.SWEEP_SECONDS.read({"GPU_OFFLOAD_SWEEP_SECONDS": "soon"})


def test_metaflow_settings_are_looked_up_without_the_prefix_as_from_conf_wants() -> None:
    conf = {"GPU_OFFLOAD_PLACEMENT_SOURCE": "live"}
    assert E.FLOW_SOURCE.get(conf.get) == "live"
    with pytest.raises(E.InvalidSetting, match="METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE='cloud'"):
        E.FLOW_SOURCE.get({"GPU_OFFLOAD_PLACEMENT_SOURCE": "cloud"}.get)


def test_what_the_hub_writes_the_kernel_reads_back() -> None:
    from gpu_offload.hub_extension.config import HubConfig
    from gpu_offload.hub_extension.spawner.user_namespace import server_environment

    from gpu_offload.engine.backends.kube.config import configured, from_environment

    config = HubConfig(default_image="python:3.12-slim", placement_policy="bin-pack",
                       object_storage_bucket="runs", object_storage_endpoint="http://s3.local:9000")
    env = server_environment("gpu-alice", config, "http://hub:10101/services/gpu-offload/")
    assert all(isinstance(v, str) for v in env.values())
    settings = from_environment({**env, "GPU_OFFLOAD_KERNEL_ID": "k1", "JUPYTERHUB_USER": "alice"})
    assert configured(env)
    assert (settings.namespace, settings.image, settings.policy) == ("gpu-alice", "python:3.12-slim", "bin-pack")
    assert settings.metered and not settings.create_offloading  # the hub meters and offloads the namespace
    assert settings.service_url == "http://hub:10101/services/gpu-offload/"
    assert settings.storage is not None
    assert (settings.storage.bucket, settings.storage.endpoint) == ("runs", "http://s3.local:9000")
    bare = server_environment("gpu-bob", HubConfig())
    assert E.SERVICE_URL.name not in bare and E.S3_BUCKET.name not in bare  # empty values are left out
