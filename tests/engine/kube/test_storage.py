"""Inputs too large for a Secret and large outputs travel through S3-compatible storage (a moto server
beside the sandbox) by presigned URLs: the pod holds no credentials, and the run's objects are removed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.backends.kube.config import StorageSettings
from gpu_offload.engine.backends.kube.storage import RunStorage, StorageError

from .conftest import BUCKET, settings
from .helpers import Sink, run_cell


@pytest.fixture()
def kube_s3(api_client: Any, namespace: str, s3: Any, s3_endpoint: str) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client)
    yield backend
    backend.close()


def test_large_inputs_and_outputs_go_through_object_storage_and_are_removed(kube_s3: KubernetesBackend,
                                                                            s3: Any, core: Any,
                                                                            namespace: str) -> None:
    big = bytes(range(256)) * (8 << 10)  # 2 MiB: more than a Secret holds
    user_ns: dict[str, Any] = {"big": big}
    cell = "import os\nprint('creds in pod:', 'AWS_SECRET_ACCESS_KEY' in os.environ)\nn = len(big)\nback = big[::-1] * 2"
    pods: list[Any] = []

    def grab_pod(_: str) -> None:
        if not pods:
            pods.extend(core.list_namespaced_pod(namespace).items)

    outcome, sink, _ = run_cell(kube_s3, cell, user_ns, Sink(on_line=grab_pod))
    assert outcome.status == "ok", outcome.error
    assert user_ns["n"] == len(big) and user_ns["back"] == big[::-1] * 2
    assert "creds in pod: False" in sink.text
    assert s3.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0
    env = {e.name: e.value for e in pods[0].spec.containers[0].env}
    assert env["GPU_OFFLOAD_BUNDLE_URL"].startswith(kube_s3.settings.storage.endpoint)  # presigned, no credentials


def test_with_storage_the_bundle_is_pickled_once_with_this_runs_upload_urls(kube_s3: KubernetesBackend,
                                                                           core: Any, namespace: str) -> None:
    # the backend chooses the run's transfer before the bundle is made; the bundle goes to the pod's stdin,
    # the Secret (which Liqo copies to donors) holds the runner only
    import pickle

    from gpu_offload.engine.analysis import analyse_cell
    from gpu_offload.engine.backends.base import RunRequest
    from gpu_offload.engine.bundle import build_job

    cell = "y = 2"
    job, _ = build_job(cell, analyse_cell(cell, {}), {}, kube_s3.transfer, request=RunRequest(gpus=1))
    run = kube_s3.submit(job)
    try:
        secret = core.read_namespaced_secret(f"{run.current.name}-runner", namespace)
        assert sorted(secret.data) == ["runner.pyz"]
        sent = pickle.loads(job.bundle)
        assert sent["output_transport"] == "url" and len(sent["output_urls"]) > 1
        assert all(f"/{job.run_id}/out-" in url for url in sent["output_urls"])
    finally:
        run.kill()
        run.release(0)


class OtherWriter:
    """The kernel's S3 client, beside which someone else with write access to the bucket replaces an object
    right after it was written (the bundle) or right before it is read (an output)."""

    def __init__(self, client: Any, target: str, body: bytes) -> None:
        self.client, self.target, self.body = client, target, body

    def put_object(self, **kwargs: Any) -> Any:
        done = self.client.put_object(**kwargs)
        if kwargs["Key"].endswith(self.target):
            self.client.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=self.body)
        return done

    def get_object(self, **kwargs: Any) -> Any:
        if kwargs["Key"].endswith(self.target):
            self.client.put_object(Bucket=kwargs["Bucket"], Key=kwargs["Key"], Body=self.body)
        return self.client.get_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def storage_of(user: str, s3: Any, s3_endpoint: str, client: Any = None) -> RunStorage:
    return RunStorage(StorageSettings(BUCKET, s3_endpoint), user, client or s3)


def test_objects_live_under_the_users_prefix_and_another_users_key_is_refused(s3: Any, s3_endpoint: str) -> None:
    alice = storage_of("alice@example.org", s3, s3_endpoint)
    bob = storage_of("bob", s3, s3_endpoint)
    stored = bob.upload("run-b", "bundle.pkl", b"bob's bundle")
    assert "/gpu-offload/bob/run-b/bundle.pkl?" in stored.url
    assert alice.key("run-a", "out-0") == "gpu-offload/alice@example.org/run-a/out-0"
    assert all("/gpu-offload/alice%40example.org/run-a/out-" in url for url in alice.output_urls("run-a"))
    with pytest.raises(StorageError, match="outside gpu-offload/alice@example.org/"):
        alice.check_key("gpu-offload/bob/run-b/bundle.pkl")
    for run_id in ("../bob/run-b", "run/../../bob", ".."):
        with pytest.raises(StorageError, match="cannot be part of an object key"):
            alice.read(run_id, "bundle.pkl", stored.sha256, 12)
    with pytest.raises(StorageError, match="cannot be part of an object key"):
        storage_of("../bob", s3, s3_endpoint)
    assert alice.remove_run("run-b") == 0 and s3.list_objects_v2(Bucket=BUCKET)["KeyCount"] == 1
    assert bob.remove_run("run-b") == 1  # the bucket is the session's: leave it as found


def test_an_output_replaced_in_the_bucket_is_refused_and_nothing_is_loaded(
        api_client: Any, namespace: str, s3: Any, s3_endpoint: str) -> None:
    storage = storage_of("alice@example.org", s3, s3_endpoint, OtherWriter(s3, "/out-0", b"not the runner's"))
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client,
                                storage=storage)
    user_ns: dict[str, Any] = {"kept": 1}
    try:
        with pytest.raises(StorageError, match="changed after the runner wrote it"):
            run_cell(backend, "kept = bytes(3 << 20)\n", user_ns)
    finally:
        backend.close()
    assert user_ns["kept"] == 1


def test_a_bundle_replaced_in_the_bucket_is_not_run(api_client: Any, namespace: str, s3: Any,
                                                    s3_endpoint: str) -> None:
    import pickle

    from gpu_offload.runner.bundle import make_bundle

    forged = pickle.dumps(make_bundle("print('PWNED')\n"), protocol=5)
    storage = storage_of("alice@example.org", s3, s3_endpoint, OtherWriter(s3, "/bundle.pkl", forged))
    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client,
                                storage=storage)
    try:
        outcome, sink, _ = run_cell(backend, "n = len(big)\n", {"big": bytes(2 << 20)})
    finally:
        backend.close()
    assert "PWNED" not in sink.text and outcome.status != "ok"
    assert "not the one the kernel uploaded" in str(outcome.error), outcome.error
