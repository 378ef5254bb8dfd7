"""The distribution exposes one namespace built from the user's fixed layout."""

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "package, folder",
    [
        ("gpu_offload.magics", "magics"),
        ("gpu_offload.liqo_peering", "liqo_peering"),
        ("gpu_offload.flows", "flows"),
        ("gpu_offload.hub_extension", "hub_extension"),
        ("gpu_offload.sandbox", "sandbox"),
    ],
)
def test_each_folder_is_a_subpackage_of_gpu_offload(package: str, folder: str) -> None:
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().parent == REPO / folder


def test_cli_prints_help_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_offload.cli import main

    assert main([]) == 2
    assert "gpu-offload" in capsys.readouterr().out
