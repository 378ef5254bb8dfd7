"""``gpu-offload run`` / ``runs`` / ``logs`` / ``cancel`` / ``doctor`` against the sandbox: the CLI in a child
process with a kubeconfig and a namespace, as a shell user has them; runner pods through the real client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_offload.liqo_peering import labels as L
from gpu_offload.sandbox.fixtures import custom, offloaded_namespace, wait_until

from ...cli.helpers import argv, cli, environment, write_project
from .conftest import BUCKET, STOCK_IMAGE, leftovers, offloaded_everywhere

__all__ = ["custom", "offloaded_everywhere", "offloaded_namespace"]
USER = "alice@example.org"


@pytest.fixture()
def env(origin: Any, namespace: str, tmp_path: Path) -> dict[str, str]:
    """A shell set up for the kubernetes backend, inside a Jupyter server's terminal (its server id set)."""
    return environment(tmp_path / "state", KUBECONFIG=str(origin.sandbox.kubeconfig),
                       GPU_OFFLOAD_NAMESPACE=namespace, GPU_OFFLOAD_IMAGE=STOCK_IMAGE, JUPYTERHUB_USER=USER,
                       GPU_OFFLOAD_SERVER_ID="server-of-this-terminal")


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "proj")


def test_a_script_runs_in_a_pod_with_its_workdir_and_exit_code(project: Path, env: dict[str, str], core: Any,
                                                               namespace: str) -> None:
    done = cli(["run", "--gpus", "1", "main.py", "exit", "3"], project.parent, env)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["hello from helper small data __main__ ['exit', '3']", "big.bin left home"]
    assert not leftovers(core, namespace, USER)  # the command deleted its pod and Secret
    (row,) = json.loads(cli(["runs", "--json"], project.parent, env).stdout)
    assert (row["kind"], row["backend"], row["state"], row["gpus"]) == ("script", "kubernetes", "failed", 1)
    assert row["cluster"].startswith("donor-")


def test_progress_is_told_while_the_pod_gets_ready(project: Path, env: dict[str, str], origin: Any) -> None:
    # the first log request is held: the run shows nothing for 5 s, as while a big image is pulled
    origin.faults.api_latency(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/log$", 5.0, methods=("GET",), times=1)
    try:
        done = cli(["run", "main.py"], project.parent, env)
    finally:
        origin.faults.clear()
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if "no output yet" in line]
    assert progress and progress[0].split(": ", 2)[2].startswith("pod ") and " on donor-" in progress[0], done.stderr
    assert "hello from helper" in done.stdout  # progress on stderr: the script's stdout stays clean


def test_ctrl_c_deletes_the_pod_and_exits_130(project: Path, env: dict[str, str], core: Any, namespace: str) -> None:
    proc = subprocess.Popen(argv("run", "--gpus", "1", "main.py", "sleep"), cwd=project.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    while "tick 1" not in (line := proc.stdout.readline()):
        assert line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=90)
    assert proc.returncode == 130
    wait_until(lambda: not leftovers(core, namespace, USER), "the interrupted run's pod gone")


def test_noblock_pod_is_a_cli_run_then_logs_follow_then_cancel(project: Path, env: dict[str, str], core: Any,
                                                                namespace: str) -> None:
    started = cli(["run", "--gpus", "1", "--noblock", "main.py", "sleep"], project.parent, env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    (pod,) = wait_until(lambda: core.list_namespaced_pod(namespace, label_selector=f"{L.RUN_ID}={run_id}").items,
                        "the run's pod")
    # labelled a CLI run and not with this terminal's Jupyter server: that server's orphan sweep cannot take it
    assert pod.metadata.labels[L.ORIGIN] == L.ORIGIN_CLI and L.SERVER not in pod.metadata.labels
    follower = subprocess.Popen(argv("logs", run_id, "-f"), cwd=project.parent, env=env, stdout=subprocess.PIPE,
                                text=True)
    seen: list[str] = []
    wait_until(lambda: seen.append(follower.stdout.readline()) or "tick 2" in seen[-1],  # type: ignore[union-attr, func-returns-value]
               "the log to follow the run")
    cancelled = cli(["cancel", run_id], project.parent, env)
    assert cancelled.returncode == 0 and f"run {run_id} ended: failed (cancelled)" in cancelled.stdout
    follower.communicate(timeout=60)
    assert follower.returncode == 0
    wait_until(lambda: not leftovers(core, namespace, USER), "the cancelled run's pod gone")


def test_doctor_on_a_good_setup(offloaded_everywhere: str, env: dict[str, str], tmp_path: Path) -> None:
    done = cli(["doctor"], tmp_path, {**env, "GPU_OFFLOAD_NAMESPACE": offloaded_everywhere})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[:2] for line in lines] == [["OK", "kubeconfig"], ["OK", "namespace"], ["OK", "offloading"],
                                                     ["OK", "reflection"], ["OK", "inventory"], ["WARN", "trust"],
                                                     ["WARN", "storage"]]
    assert "(Local, phase Ready)" in lines[2]
    assert "2 cluster(s), 2 virtual node(s), 12 GPU(s)" in lines[4] and "GPU_OFFLOAD_S3_BUCKET" in lines[6]
    assert "donor-1, donor-2 not trusted" in lines[5] and "GPU_OFFLOAD_TRUSTED_CLUSTERS" in lines[5]
    trusting = cli(["doctor"], tmp_path, {**env, "GPU_OFFLOAD_NAMESPACE": offloaded_everywhere,
                                          "GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-1,donor-2"})
    assert "OK    trust       every peered cluster is trusted (donor-1, donor-2)" in trusting.stdout


def test_doctor_warns_when_liqo_would_copy_user_data_or_send_any_pod_to_donors(
        offloaded_namespace: str, core: Any, env: dict[str, str], tmp_path: Path) -> None:
    # offloaded_namespace is LocalAndRemote: Liqo's webhook lets every pod of it reach a donor
    core.create_namespaced_secret(offloaded_namespace, {"metadata": {"name": "wandb-key"},
                                                        "stringData": {"key": "s3cr3t"}})
    core.create_namespaced_secret(offloaded_namespace, {"metadata": {
        "name": "kept-home", "annotations": {"liqo.io/skip-reflection": "true"}}, "stringData": {"key": "s3cr3t"}})
    done = cli(["doctor"], tmp_path, {**env, "GPU_OFFLOAD_NAMESPACE": offloaded_namespace})
    lines = {line.split()[1]: line for line in done.stdout.splitlines()}
    assert lines["offloading"].startswith("WARN") and "podOffloadingStrategy LocalAndRemote" in lines["offloading"]
    assert "set it to Local" in lines["offloading"]
    assert lines["reflection"].startswith("WARN") and "Liqo copies Secret/wandb-key of" in lines["reflection"]
    assert "kept-home" not in lines["reflection"] and "AllowList" in lines["reflection"]


def test_doctor_warns_when_liqo_copies_kueues_label_of_queued_runs_to_donors(
        offloaded_everywhere: str, env: dict[str, str], tmp_path: Path) -> None:
    # The sandbox's virtual nodes are as Liqo installs them by default: no label kept off donor pods (real
    # Liqo then copies the queue-name label, and a donor's Kueue gates the pod: tests/realcluster/test_real_liqo.py)
    done = cli(["doctor"], tmp_path, {**env, "GPU_OFFLOAD_NAMESPACE": offloaded_everywhere,
                                      "GPU_OFFLOAD_QUEUE": "user-queue"})
    lines = {line.split()[1]: line for line in done.stdout.splitlines()}
    assert lines["kueue"].startswith("WARN") and "offloading.reflection.skip.labels" in lines["kueue"]
    assert "virtual node(s) donor-1-gpu, donor-2-gpu" in lines["kueue"], lines["kueue"]


def test_doctor_on_a_broken_setup_names_the_fix(env: dict[str, str], tmp_path: Path) -> None:
    missing = cli(["doctor"], tmp_path, {**env, "GPU_OFFLOAD_NAMESPACE": "no-such-ns"})
    assert missing.returncode == 1
    assert "FAIL  namespace   namespace no-such-ns does not exist: kubectl create namespace no-such-ns" in missing.stdout
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(Path(env["KUBECONFIG"]).read_text().replace("127.0.0.1:", "127.0.0.1:1"))
    down = cli(["doctor"], tmp_path, {**env, "KUBECONFIG": str(unreachable)})
    assert down.returncode == 1 and down.stdout.startswith("FAIL  kubeconfig") and "cannot be reached" in down.stdout


def test_a_background_run_whose_follower_died_is_cancelled_by_deleting_its_pod(
        project: Path, env: dict[str, str], core: Any, namespace: str) -> None:
    started = cli(["run", "--gpus", "1", "--noblock", "main.py", "sleep"], project.parent, env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    record = json.loads((Path(env["GPU_OFFLOAD_STATE_DIR"]) / f"{run_id}.json").read_text())
    wait_until(lambda: "tick 1" in Path(record["log"]).read_text(), "the script to run")
    os.kill(record["pid"], signal.SIGKILL)  # the machine's follower is gone; the pod runs on
    (row,) = json.loads(cli(["runs", "--json"], project.parent, env).stdout)
    assert row["state"] == "failed" and "is gone" in row["detail"]
    assert core.list_namespaced_pod(namespace, label_selector=f"{L.RUN_ID}={run_id}").items
    logs = cli(["logs", run_id], project.parent, env)
    assert logs.returncode == 0 and "tick 1" in logs.stdout  # what the follower wrote stays readable
    assert "without object storage (GPU_OFFLOAD_S3_BUCKET)" in logs.stderr and "gone with the pod" in logs.stderr
    cancelled = cli(["cancel", run_id], project.parent, env)
    assert cancelled.returncode == 0 and "had no live kernel; deleted" in cancelled.stdout, cancelled.stdout
    wait_until(lambda: not leftovers(core, namespace, USER), "the orphaned run's pod gone")


def test_runs_finds_the_pods_in_the_kubeconfig_contexts_namespace_as_the_kernels_do(
        project: Path, env: dict[str, str], core: Any, namespace: str, tmp_path: Path) -> None:
    started = cli(["run", "--gpus", "1", "--noblock", "main.py", "sleep"], project.parent, env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    wait_until(lambda: core.list_namespaced_pod(namespace, label_selector=f"{L.RUN_ID}={run_id}").items,
               "the run's pod")
    # another shell: no GPU_OFFLOAD_NAMESPACE, a kubeconfig whose context names the namespace, no records
    config = yaml.safe_load(Path(env["KUBECONFIG"]).read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    shell = {k: v for k, v in env.items() if k != "GPU_OFFLOAD_NAMESPACE"}
    shell.update(KUBECONFIG=str(kubeconfig), GPU_OFFLOAD_BACKEND="kubernetes",
                 GPU_OFFLOAD_STATE_DIR=str(tmp_path / "other-state"))
    listed = cli(["runs", "--json"], project.parent, shell)
    assert listed.returncode == 0, listed.stderr
    assert [row["run_id"] for row in json.loads(listed.stdout)] == [run_id]
    assert cli(["cancel", run_id], project.parent, env).returncode == 0
    wait_until(lambda: not leftovers(core, namespace, USER), "the cancelled run's pod gone")


@pytest.fixture()
def stored(env: dict[str, str], s3: Any, s3_endpoint: str) -> Iterator[dict[str, str]]:
    """The shell of ``env`` with object storage: the moto bucket, and credentials only in this shell. The
    logs the test's runs kept are removed after it (the bucket is shared by the session's tests)."""
    yield {**env, "GPU_OFFLOAD_S3_BUCKET": BUCKET, "GPU_OFFLOAD_S3_ENDPOINT": s3_endpoint,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"gpu-offload/{USER}/").get("Contents") or []:
        s3.delete_object(Bucket=BUCKET, Key=item["Key"])


def elsewhere(shell: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The same user on another machine: no records of this one's runs."""
    return {**shell, "GPU_OFFLOAD_STATE_DIR": str(tmp_path / "another-machine")}


def test_with_storage_a_background_runs_log_outlives_its_pod(project: Path, stored: dict[str, str], s3: Any,
                                                            core: Any, namespace: str, tmp_path: Path) -> None:
    started = cli(["run", "--gpus", "1", "--noblock", "main.py", "raise"], project.parent, stored)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    wait_until(lambda: json.loads(cli(["runs", "--json"], project.parent, stored).stdout)[0]["state"] == "failed",
               "the run to end", timeout=120)
    wait_until(lambda: not leftovers(core, namespace, USER), "its pod and Secret deleted by its follower")
    # the run's other objects are gone; its log stays, under the user's prefix
    mine = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"gpu-offload/{USER}/")  # other tests' objects are theirs
    keys = [item["Key"] for item in mine.get("Contents") or []]
    assert keys == [f"gpu-offload/{USER}/{run_id}/log"]
    # read where neither the pod nor a record of the run is: from the stored log only
    logs = cli(["logs", run_id], project.parent, elsewhere(stored, tmp_path))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("hello from helper small data __main__ ['raise']\nbig.bin left home\n")
    assert "ValueError: boom from the script" in logs.stdout
    unstored = {k: v for k, v in elsewhere(stored, tmp_path).items() if not k.startswith("GPU_OFFLOAD_S3")}
    gone = cli(["logs", run_id], project.parent, unstored)
    assert gone.returncode == 1 and "without object storage (GPU_OFFLOAD_S3_BUCKET)" in gone.stderr


def test_with_storage_the_log_of_a_run_whose_follower_died_is_kept_when_its_pod_ends(
        project: Path, stored: dict[str, str], core: Any, namespace: str) -> None:
    started = cli(["run", "--gpus", "1", "--noblock", "main.py", "sleep"], project.parent, stored)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[1]
    record = json.loads((Path(stored["GPU_OFFLOAD_STATE_DIR"]) / f"{run_id}.json").read_text())
    wait_until(lambda: "tick 1" in Path(record["log"]).read_text(), "the script to run")
    os.kill(record["pid"], signal.SIGKILL)  # the follower is gone; the pod runs on
    meanwhile = cli(["logs", run_id], project.parent, stored)
    assert meanwhile.returncode == 0 and "tick 1" in meanwhile.stdout
    assert "its pod still runs" in meanwhile.stderr and "kept in object storage when it ends" in meanwhile.stderr
    waiting = subprocess.Popen(argv("logs", run_id, "-f"), cwd=project.parent, env=stored, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    follower_wrote = Path(record["log"]).read_text()
    assert cli(["cancel", run_id], project.parent, stored).returncode == 0  # the pod gets SIGTERM, its grace
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    # the whole log, from the runner: what the dead follower saw, then the rest, to the interruption
    assert out.startswith("hello from helper") and follower_wrote.splitlines()[-1] in out.splitlines()
    ticks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("tick ")]
    assert ticks == list(range(len(ticks))) and "KeyboardInterrupt" in out
    wait_until(lambda: not leftovers(core, namespace, USER), "the cancelled run's pod gone")


def _cluster_of_last_run(project: Path, env: dict[str, str]) -> str:
    rows = json.loads(cli(["runs", "--json"], project.parent, env).stdout)
    return str(rows[0]["cluster"])


def test_the_hubs_trusted_only_and_gpu_model_reach_a_shell_run(project: Path, env: dict[str, str]) -> None:
    # donor-2 has the most free GPUs (8 L4), so a run that heeds neither setting lands there
    trusting = {**env, "GPU_OFFLOAD_TRUSTED_CLUSTERS": "donor-1"}
    done = cli(["run", "main.py"], project.parent, {**trusting, "GPU_OFFLOAD_TRUSTED_ONLY": "1"})
    assert done.returncode == 0, done.stderr
    assert _cluster_of_last_run(project, env) == "donor-1"
    done = cli(["run", "main.py"], project.parent, {**env, "GPU_OFFLOAD_GPU_MODEL": "A100"})
    assert done.returncode == 0, done.stderr
    assert _cluster_of_last_run(project, env) == "donor-1"
    # the command line still chooses over the environment's default model
    done = cli(["run", "--gpu-model", "L4", "main.py"], project.parent, {**env, "GPU_OFFLOAD_GPU_MODEL": "A100"})
    assert done.returncode == 0, done.stderr
    assert _cluster_of_last_run(project, env) == "donor-2"


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_trusted_only_with_no_trusted_donor_refuses_before_anything_starts(
        project: Path, env: dict[str, str], core: Any, namespace: str, how: str) -> None:
    words, extra = (["run", "--trusted-only", "main.py"], {}) if how == "flag" else (
        ["run", "main.py"], {"GPU_OFFLOAD_TRUSTED_ONLY": "1"})
    done = cli(words, project.parent, {**env, **extra})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "trusted" in done.stderr and "GPU_OFFLOAD_TRUSTED_CLUSTERS" in done.stderr, done.stderr
    assert "hello from helper" not in done.stdout
    assert not leftovers(core, namespace, USER)



def test_donor_check_fails_on_a_twin_namespace_below_the_origins_level_and_names_the_fix(
        core: Any, env: dict[str, str], tmp_path: Path) -> None:
    # The sandbox's API server stands in for the donor cluster: the twin namespaces are what Liqo creates there.
    suffix = os.urandom(3).hex()
    twins = {f"alice-ns-{suffix}": "baseline", f"bob-ns-{suffix}": None, f"carol-ns-{suffix}": "restricted"}
    created = []
    try:
        for name, level in twins.items():
            labels = {"liqo.io/remote-cluster-id": "origin-a" if name.startswith("carol") else "origin-b"}
            if level:
                labels["pod-security.kubernetes.io/enforce"] = level
            core.create_namespace({"metadata": {"name": name, "labels": labels, "annotations": {
                "liqo.io/managed-by-namespace-map": f"liqo-tenant-x/{name}"}}})
            created.append(name)
        # a namespace with Liqo's label but not Liqo's twin (a tenant namespace) is not checked
        core.create_namespace({"metadata": {"name": f"tenant-{suffix}", "labels": {
            "liqo.io/remote-cluster-id": "origin-b"}}})
        created.append(f"tenant-{suffix}")

        done = cli(["donor", "check", "--expect", "restricted", "--json"], tmp_path, env)
        assert done.returncode == 1, done.stderr
        lines = {line["namespace"]: line for line in json.loads(done.stdout)["lines"]}
        mine = {name: line for name, line in lines.items() if name.endswith(suffix)}
        assert {name: line["status"] for name, line in mine.items()} == {
            f"alice-ns-{suffix}": "FAIL", f"bob-ns-{suffix}": "FAIL", f"carol-ns-{suffix}": "OK"}
        assert (f"kubectl label namespace bob-ns-{suffix} --overwrite pod-security.kubernetes.io/enforce=restricted"
                in mine[f"bob-ns-{suffix}"]["text"])
        assert "less than the restricted" in mine[f"alice-ns-{suffix}"]["text"]

        only_a = cli(["donor", "check", "--expect", "restricted", "--origin", "origin-a"], tmp_path, env)
        assert only_a.returncode == 0, only_a.stdout + only_a.stderr
        assert only_a.stdout.split() == ["OK", f"carol-ns-{suffix}", "enforces", "restricted", "(at", "least",
                                         "restricted)"]
        nobody = cli(["donor", "check", "--origin", "origin-z"], tmp_path, env)
        assert nobody.returncode == 0 and nobody.stdout.startswith("WARN") and "nothing to check" in nobody.stdout
    finally:
        for name in created:
            core.delete_namespace(name)
