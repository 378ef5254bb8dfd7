"""The runner zipapp: what it carries, where it is cached, and concurrent kernels building it at once."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpu_offload.runner.build import build_runner, cache_dir


def test_the_archive_carries_the_runner_and_its_two_libraries(runner_pyz: Path) -> None:
    names = set(zipfile.ZipFile(runner_pyz).namelist())
    assert {"__main__.py", "gpo_runner/frames.py", "gpo_runner/__main__.py", "pynvml.py"} <= names
    assert "cloudpickle/__init__.py" in names and "cloudpickle/cloudpickle.py" in names
    assert "gpo_runner/build.py" not in names  # building needs the project; the runner never builds
    assert "gpo_runner/frames.pyc" in names  # bytecode beside the source: zipimport cannot cache it


def test_a_second_build_reuses_the_cached_archive(runner_pyz: Path) -> None:
    before = runner_pyz.stat().st_mtime_ns
    assert build_runner(runner_pyz.parent) == runner_pyz
    assert runner_pyz.stat().st_mtime_ns == before


@pytest.mark.e2e  # starts a process
def test_concurrent_builds_agree_and_leave_no_temporary_files(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom gpu_offload.runner.build import build_runner\n"
        "print(build_runner(__import__('pathlib').Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    paths = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(paths) == 1
    built = Path(paths.pop())
    assert zipfile.ZipFile(built).testzip() is None
    assert [p.name for p in tmp_path.iterdir()] == [built.name]


def test_the_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "gpu-offload"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "gpu-offload"


def test_an_unusable_cache_dir_says_what_to_set(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="XDG_CACHE_HOME") as failure:
        build_runner(blocker / "cache")
    assert str(blocker / "cache") in str(failure.value)
