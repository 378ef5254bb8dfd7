"""What ``gpu-offload run`` ships of a script's directory: .gitignore honoured, a cap that names its fix, and
nothing reached through a symbolic link leading out of the directory."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from gpu_offload.cli.workdir import WorkdirError, pack

from .helpers import write_project


def names(archive: bytes) -> set[str]:
    return set(zipfile.ZipFile(io.BytesIO(archive)).namelist())


def test_the_directory_travels_without_what_gitignore_excludes(tmp_path: Path) -> None:
    script = write_project(tmp_path / "proj")
    (tmp_path / "proj" / "pkg").mkdir()
    (tmp_path / "proj" / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "proj" / "pkg" / ".gitignore").write_text("*.ckpt\n")
    (tmp_path / "proj" / "pkg" / "model.ckpt").write_text("weights")
    (tmp_path / "proj" / "__pycache__").mkdir()
    (tmp_path / "proj" / "__pycache__" / "helper.pyc").write_bytes(b"x")
    shipped = pack(script)
    assert names(shipped.archive) == {"main.py", "helper.py", "data.txt", ".gitignore", "pkg/mod.py",
                                      "pkg/.gitignore"}


def test_over_the_cap_the_error_names_the_cap_the_biggest_file_and_the_fix(tmp_path: Path) -> None:
    script = write_project(tmp_path / "proj")
    (tmp_path / "proj" / ".gitignore").write_text("")  # big.bin is no longer ignored
    with pytest.raises(WorkdirError) as caught:
        pack(script)
    message = str(caught.value)
    assert "10 MB cap" in message and "big.bin (12.0 MB)" in message
    assert ".gitignore" in message and "--max-workdir-mb" in message
    assert "big.bin" in names(pack(script, limit_mb=20).archive)


def test_a_link_out_of_the_directory_is_left_home_and_in_files_are_added(tmp_path: Path) -> None:
    script = write_project(tmp_path / "proj")
    secret = tmp_path / "secret.txt"
    secret.write_text("private key")
    (tmp_path / "proj" / "key").symlink_to(secret)
    extra = tmp_path / "extra.csv"
    extra.write_text("a,b\n")
    shipped = names(pack(script, [extra]).archive)
    assert "key" not in shipped and "extra.csv" in shipped
    with pytest.raises(WorkdirError, match="no such file"):
        pack(script, [tmp_path / "missing.csv"])
