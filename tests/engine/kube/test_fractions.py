"""Parts of a GPU on the sandbox: donors that share GPUs in each mode, two half-GPU cells on one GPU, a third
refused while they hold it, a donor lending whole GPUs refusing with the reason, and nothing left behind."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import origin_fixture, wait_until
from gpu_offload.sandbox.liqo import seed as liqo

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError

from ...cli.helpers import cli, environment
from ...runner.fake_gpu import prelude
from .conftest import IMAGE_MAP, SHARED, STOCK_IMAGE, leftovers
from .helpers import Sink, run_cell

DONORS = (
    liqo.Donor("whole", 2, "A100", "2.00"),
    liqo.Donor("sliced", 1, "A100", "1.00", sharing="time-slicing", replicas=2),
    liqo.Donor("mig", 1, "A100", "1.50", sharing="mig"),
)
origin = origin_fixture(SHARED / "liqo-crds", donors=DONORS, image_map=IMAGE_MAP)

# pods see none of the test's files: each cell holds its share until a moment given as an input, time enough for
# both pods to start on a loaded machine
WAIT = "import os, time\nwhile time.time() < until:\n    time.sleep(0.1)\nseen = os.environ.get('GPU_OFFLOAD_GPU_ISOLATION')\ndevice = os.environ.get('NVIDIA_VISIBLE_DEVICES')"
HOLD = 25.0


def _in_thread(kube: KubernetesBackend, cell: str, user_ns: dict[str, Any], sink: Sink, **placement: Any,
               ) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def go() -> None:
        try:
            result["outcome"] = run_cell(kube, cell, user_ns, sink, **placement)[0]
        except BaseException as exc:  # reported by the test
            result["error"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    return thread, result


def test_two_half_gpu_cells_share_one_gpu_and_a_third_is_refused_while_they_hold_it(
        kube: KubernetesBackend, core: Any, namespace: str) -> None:
    until = time.time() + HOLD
    sinks = [Sink(), Sink()]
    spaces: list[dict[str, Any]] = [{"until": until}, {"until": until}]
    running = [_in_thread(kube, WAIT, spaces[i], sinks[i], fraction=0.5, cluster="sliced") for i in range(2)]

    def both_running() -> bool:
        pods = core.list_namespaced_pod(namespace).items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    try:
        wait_until(both_running, "both half-GPU pods running at once", timeout=HOLD)
        pods = core.list_namespaced_pod(namespace).items
        assert {p.spec.node_name for p in pods} == {"sliced-gpu"}  # the one GPU of the time-slicing donor
        assert [p.spec.containers[0].resources.limits for p in pods] == [{"nvidia.com/gpu.shared": "1"}] * 2
        with pytest.raises(OffloadUsageError, match=r"Nothing was launched: no cluster has room for 0.5 of a GPU right now.*sliced: time-slicing donor, 1 nvidia.com/gpu.shared not free"):
            run_cell(kube, "x = 1", {}, fraction=0.5, cluster="sliced")
    finally:
        for thread, _ in running:
            thread.join(120)
    for (_, result), sink, space in zip(running, sinks, spaces, strict=True):
        assert "error" not in result, result.get("error")
        assert result["outcome"].status == "ok", result["outcome"].error
        assert space["seen"] == "none"  # the runner was told its isolation
        assert space["device"] == "GPU-sliced-gpu-0"  # as the device plugin tells a pod: one GPU, shared
        assert any("0.5 of a GPU (time-slicing" in n and "isolation: none" in n for n in sink.notices), sink.notices
        # said once per run, with a donor that isolates memory to pick instead
        warned = [n for n in sink.notices if "0.5 of a GPU is not memory-isolated on cluster sliced" in n]
        assert len(warned) == 1 and "(--cluster mig) or ask for a whole GPU (--gpus 1)" in warned[0], sink.notices
    wait_until(lambda: not leftovers(core, namespace), "pods and Secrets deleted")


def test_memory_sized_part_goes_to_the_smallest_mig_profile_and_whole_gpus_skip_sharing_donors(
        kube: KubernetesBackend, core: Any, namespace: str) -> None:
    sink = Sink()
    outcome, _, run = run_cell(kube, "import os\nlimit = os.environ.get('GPU_OFFLOAD_GPU_MEMORY_LIMIT')", ns := {},
                               sink, gpu_memory=8 * 2**30)
    assert outcome.status == "ok", outcome.error
    assert run.current.ctx.cluster == "mig"
    assert ns["limit"] == str(10 * 2**30)  # the 1g.10gb profile's memory: the runner caps itself there
    assert any("mig: 1 nvidia.com/mig-1g.10gb; isolation: compute and memory" in n for n in sink.notices)
    assert not any("not memory-isolated" in n for n in sink.notices), sink.notices
    outcome, _, run = run_cell(kube, "y = 2", {}, gpus=2)
    assert outcome.status == "ok" and run.current.ctx.cluster == "whole"


def test_a_part_larger_than_any_donor_lends_is_refused_naming_each_donor(kube: KubernetesBackend) -> None:
    with pytest.raises(OffloadUsageError) as caught:
        run_cell(kube, "x = 1", {}, gpu_memory=60 * 2**30, cluster="mig")
    assert "no MIG profile here holds 60.0 GiB (the largest, 3g.40gb, holds 40.0 GiB)" in str(caught.value)
    with pytest.raises(OffloadUsageError, match="whole: this donor lends whole GPUs only"):
        run_cell(kube, "x = 1", {}, fraction=0.5, cluster="whole")


def test_a_half_gpu_cell_that_grows_past_its_half_is_stopped_and_told_what_to_ask_for(
        kube: KubernetesBackend, core: Any, namespace: str) -> None:
    # the cell allocates on a GPU plugged into its runner (the machine has none); the watch, the stop and the
    # message are the runner's and the engine's own
    cell = prelude(80) + "gpu_alloc(45)\nimport time\ntime.sleep(60)\nkept = 1\n"
    sink = Sink()
    outcome, _, run = run_cell(kube, cell, ns := {}, sink, fraction=0.5, cluster="sliced")
    assert outcome.status == "error"
    assert outcome.error is not None and outcome.error.ename == "GpuMemoryExceeded"
    assert ("held 45.0 GiB of GPU memory, more than its part (0.5 of a GPU, 40.0 GiB; time-slicing), and it would "
            "take memory the other cells on this GPU need") in outcome.error.evalue
    assert "Ask for --gpu-memory 50Gi, or a whole GPU with --gpus 1" in outcome.error.evalue
    assert "kept" not in ns
    wait_until(lambda: not leftovers(core, namespace), "pods and Secrets deleted")


def test_gpu_offload_run_asks_for_half_a_gpu_as_a_cell_does(origin: Any, core: Any, namespace: str,
                                                            tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('part', os.environ.get('GPU_OFFLOAD_GPU_FRACTION'), "
                                      "os.environ.get('NVIDIA_VISIBLE_DEVICES'), flush=True)\n")
    env = environment(tmp_path / "state", KUBECONFIG=str(origin.sandbox.kubeconfig), GPU_OFFLOAD_NAMESPACE=namespace,
                      GPU_OFFLOAD_IMAGE=STOCK_IMAGE, JUPYTERHUB_USER="alice@example.org")
    done = cli(["run", "--gpus", "0.5", "--cluster", "sliced", "train.py"], project, env)
    assert done.returncode == 0, done.stderr
    # the runner was told its part, on the one time-sliced GPU as the device plugin lends a share of it
    assert done.stdout.splitlines() == ["part 0.5 GPU-sliced-gpu-0"], done.stdout
    assert "0.5 of a GPU (time-slicing: 1 nvidia.com/gpu.shared; isolation: none)" in done.stderr, done.stderr
    refused = cli(["run", "--gpus", "0.5", "--cluster", "whole", "train.py"], project, env)
    assert refused.returncode != 0 and "whole: this donor lends whole GPUs only" in refused.stderr, refused.stderr
    wait_until(lambda: not leftovers(core, namespace), "pods and Secrets deleted")
