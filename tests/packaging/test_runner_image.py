"""Each runner image built here runs a cell's bundle the way a runner pod does (the pod's own command,
environment, non-root user and read-only bundle mount) and streams its frames; its labels declare what it
holds."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from gpu_offload.liqo_peering.specs import MOUNT_PATH, RUNNER_KEY, RunnerPodSpec, runner_pod

from gpu_offload.images import ImageSpec
from gpu_offload.runner.build import build_runner
from gpu_offload.runner.bundle import encode_bundle, make_bundle
from gpu_offload.runner.frames import Done, Error, FrameDecoder, Hello, Noise, Outputs, Stream

from .conftest import built_here, labels, podman, podman_env

RUNNERS = built_here("runner")
CELL = "import sys\nprint('hello from', sys.version.split()[0], flush=True)\ny = x * 2"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bundle")
    folder.chmod(0o755)  # read by the image's non-root user, as a Secret mounted 0444
    runner = build_runner(tmp_path_factory.mktemp("runner-cache"))
    (folder / RUNNER_KEY).write_bytes(runner.read_bytes())
    return folder


def _run(spec: ImageSpec, folder: Path) -> tuple[list[Any], int, str]:
    bundle = make_bundle(CELL, inputs={"x": 21}, input_transport="inline", outputs=["y"], output_transport="inline",
                         python=spec.declared.python, first_line=2)
    (folder / RUNNER_KEY).chmod(0o444)
    pod = runner_pod(RunnerPodSpec(run_id="r1", namespace="alice", image=spec.image, user="alice", kernel="k",
                                     scheduling={}))
    container = pod["spec"]["containers"][0]
    env = [f"--env={e['name']}={e['value']}" for e in container["env"]]
    uid = pod["spec"]["securityContext"]["runAsUser"]
    # the bundle comes on the container's stdin, as the kernel's attach sends it
    command = ["podman", "run", "--rm", "-i", "--network", "none", f"--user={uid}:{uid}", "--cap-drop=ALL",
               "--security-opt=no-new-privileges", f"--volume={folder}:{MOUNT_PATH}:ro", *env,
               spec.image, *container["command"]]
    done = subprocess.run(command, input=encode_bundle(bundle), capture_output=True, env=podman_env(), timeout=300)
    decoder = FrameDecoder(bundle["nonce"])
    events = [e for e in decoder.feed(done.stdout) if not isinstance(e, Noise)]
    events += [e for e in decoder.close() if not isinstance(e, Noise)]
    return events, done.returncode, done.stderr.decode()


@pytest.mark.parametrize("spec", RUNNERS, ids=[s.image for s in RUNNERS])
def test_the_runner_image_runs_a_bundle_as_its_pod_would_and_streams_frames(
        built: None, bundle_dir: Path, spec: ImageSpec) -> None:
    events, code, stderr = _run(spec, bundle_dir)
    assert code == 0, stderr
    assert not [e for e in events if isinstance(e, Error)], events
    hello = next(e for e in events if isinstance(e, Hello))
    assert hello.python.rsplit(".", 1)[0] == spec.declared.python  # the image's own Python
    text = "".join(e.text for e in events if isinstance(e, Stream))
    assert f"hello from {hello.python}" in text
    outputs = next(e for e in events if isinstance(e, Outputs))
    assert outputs.names == ("y",) and not outputs.buffers
    assert cloudpickle.loads(base64.b64decode(outputs.pickle)) == {"y": 42}
    assert isinstance(events[-1], Done) and events[-1].status == "ok"


@pytest.mark.parametrize("spec", RUNNERS, ids=[s.image for s in RUNNERS])
def test_the_labels_declare_what_the_image_holds(built: None, spec: ImageSpec) -> None:
    from gpu_offload.images import manifest

    keys = manifest().labels
    declared = labels(spec.image)
    assert {name: declared.get(key) for name, key in keys.items()} == {
        "python": spec.declared.python, "cloudpickle": spec.declared.cloudpickle, "torch": spec.declared.torch}
    held = podman("run", "--rm", "--network", "none", spec.image, "python3", "-c",
                  "import sys, importlib.metadata as m; print('%d.%d' % sys.version_info[:2], m.version('cloudpickle'))")
    assert held.stdout.split() == [spec.declared.python, spec.declared.cloudpickle]
