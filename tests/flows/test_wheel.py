"""A regular wheel ships the Metaflow extension where Metaflow's loader finds it.

Built with ``pip wheel`` and installed into a fresh virtualenv (dependencies come from the project's venv
through a path entry, the project itself only from the wheel).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXT = "metaflow_extensions/gpu_offload"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "-w", str(out), "--no-deps", "-q"],
        check=True, capture_output=True, timeout=280,
    )
    (found,) = out.glob("jupyter_gpu_offload-*.whl")
    return found


def test_wheel_holds_the_extension_as_a_namespace_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert f"{EXT}/plugins/mfextinit_gpu_offload.py" in names
    assert f"{EXT}/toplevel/mfextinit_gpu_offload.py" in names
    assert f"{EXT}/toplevel/gpu_offload_toplevel.py" in names
    # Metaflow refuses a metaflow_extensions with an __init__.py; and the folder is not shipped twice.
    assert "metaflow_extensions/__init__.py" not in names
    assert not any(n.startswith("gpu_offload/flows/metaflow_extensions") for n in names)
    assert "gpu_offload/flows/mutation.py" in names


def test_metaflow_loads_the_extension_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    # After the wheel's own entries on sys.path: metaflow, boto3, ... from the project's venv.
    Path(site, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = (
        "import metaflow, gpu_offload.flows\n"
        "from metaflow.extension_support import _all_packages\n"
        "print(metaflow.gpu_offload.decorator_name)\n"
        "print(gpu_offload.flows.__file__)\n"
        "print(_all_packages['jupyter-gpu-offload']['root_paths'][0])\n"
    )
    out = subprocess.run(
        [str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path, timeout=120
    ).stdout.split()
    assert out[0] == "gpu_offload"
    assert out[1].startswith(site) and out[2] == f"{site}/metaflow_extensions"
