"""The packaging stage: the images built here with podman (``images/build.sh --local``) and the lean install.

These tests run in their own CI stage (``images/ci.sh``, after the main suite), which sets
``GPU_OFFLOAD_PACKAGING_TESTS=1``; the main suite leaves them out. In that stage nothing is skipped: an image
that does not build, or a podman that does not run, fails the test that needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpu_offload import images

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = REPO / "images" / "containers.conf"
BUILD_TIMEOUT = 3600  # a guard against a hung build, not a speed claim

if os.environ.get("GPU_OFFLOAD_PACKAGING_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]  # the main suite; images/ci.sh runs these


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py sorts tests into lanes
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # every test here runs processes (podman, pip, a sandbox); the first of a session waits for the images
    # to build, more than the suite's per-test timeout
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT))


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout: float = 600, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with the project's containers.conf; raises with podman's output when it fails."""
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout,
                          **kwargs)
    if check and done.returncode:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def labels(image: str) -> dict[str, str]:
    return json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout) or {}


def built_here(role: str) -> tuple[images.ImageSpec, ...]:
    """The images of ``role`` that are built on local Debian bases here."""
    return tuple(spec for spec in images.manifest().role(role) if spec.debian)


@pytest.fixture(scope="session")
def built() -> Iterator[None]:
    """Builds the slim images once per session with the README's command (layers are cached by podman)."""
    done = subprocess.run(["bash", str(REPO / "images" / "build.sh"), "--local", "--only", "hub", "singleuser",
                           "runner"], capture_output=True, text=True, env=podman_env(), timeout=BUILD_TIMEOUT)
    print(done.stdout)
    assert done.returncode == 0, f"images/build.sh --local failed:\n{done.stdout}\n{done.stderr}"
    yield


class Container:
    """A detached container, removed (with whatever it started) when the test ends."""

    def __init__(self, image: str, command: Sequence[str], options: Sequence[str] = ()) -> None:
        self.name = podman("run", "-d", "--network", "host", *options, image, *command).stdout.strip()

    def running(self) -> bool:
        done = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return done.stdout.strip() == "true"

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def exec(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, timeout=timeout, check=False)

    def remove(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)
