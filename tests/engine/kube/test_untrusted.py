"""Donors the origin does not trust, on the sandbox: a hostile pod's crafted outputs run nothing, delete nothing
and fetch nothing in the kernel; ordinary values and figures still come back; ``--trusted-only`` keeps a
cell off them; a trusted donor still sends pickles.

The sandbox's donors are untrusted unless a test trusts one (``settings(trusted=...)``). The hostile runner
is ``evil_donor.py``, started by the kubelet for the image ``evil-donor:1``: it reads the pod's Secret and
writes well-formed frames, as whoever runs the pod on a donor can.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_offload.sandbox.fixtures import wait_until

from gpu_offload.engine.backends.kube.backend import KubernetesBackend
from gpu_offload.engine.errors import OffloadUsageError
from gpu_offload.engine.trust.intake import UntrustedOutputs

from .conftest import EVIL_IMAGE, PROJECT_IMAGE, leftovers, settings
from .helpers import Sink, run_cell


def _evil(kube: KubernetesBackend, mode: str, user_ns: dict[str, Any], **env: str) -> tuple[Any, Sink]:
    sink = Sink()
    outcome, _, _ = run_cell(kube, "y = x + 1", user_ns, sink, image=EVIL_IMAGE, env={"EVIL_MODE": mode, **env})
    return outcome, sink


def test_a_donors_pickle_runs_no_code_in_the_kernel(kube: KubernetesBackend, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    user_ns: dict[str, Any] = {"x": 1, "y": "mine"}
    with pytest.raises(UntrustedOutputs, match=r"donor-2, a cluster this notebook does not trust.*as 'pickle'.*"
                       r"never loaded.*your variables are untouched"):
        _evil(kube, "pickle", user_ns, EVIL_MARKER=str(marker))
    assert not marker.exists()
    assert user_ns == {"x": 1, "y": "mine"}


def test_a_donors_shared_memory_reference_neither_reads_nor_deletes_a_kernel_file(kube: KubernetesBackend,
                                                                                tmp_path: Path) -> None:
    victim = tmp_path / "notes.txt"
    victim.write_text("the user's notes")
    user_ns: dict[str, Any] = {"x": 1}
    with pytest.raises(UntrustedOutputs, match="a file on this machine"):
        _evil(kube, "shm", user_ns, EVIL_VICTIM=str(victim))
    assert victim.read_text() == "the user's notes"
    assert user_ns == {"x": 1}


@pytest.fixture()
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 recording the paths asked of it (a URL a donor would send the kernel to)."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "16")
            self.end_headers()
            self.wfile.write(b"GPUOSAFE1\n" + bytes(6))

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/steal?from=kernel", asked
    server.shutdown()
    server.server_close()


def test_a_donors_foreign_url_is_never_fetched(kube: KubernetesBackend, listener: tuple[str, list[str]]) -> None:
    url, asked = listener
    user_ns: dict[str, Any] = {"x": 1}
    with pytest.raises(UntrustedOutputs, match="a URL that is not one of this run's uploads"):
        _evil(kube, "url", user_ns, EVIL_URL=url)
    assert asked == []
    assert user_ns == {"x": 1}


def test_a_donors_rich_output_is_filtered_and_published_untrusted(kube: KubernetesBackend) -> None:
    outcome, sink = _evil(kube, "display", {"x": 1})
    assert outcome.status == "ok", outcome.error
    ((data, metadata),) = sink.displays_with_metadata
    assert "numbers" in data["text/html"] and "<script" not in data["text/html"]
    assert "onerror" not in data["text/html"] and "/api/contents" not in data["text/html"]
    assert data["image/png"].startswith("iVBORw0KGgo") and "application/javascript" not in data
    assert metadata == {"trusted": False}
    assert any("application/javascript" in n and "donor-2" in n for n in sink.notices), sink.notices


def test_ordinary_values_come_back_intact_from_an_untrusted_donor(kube: KubernetesBackend) -> None:
    cell = (
        "import numpy as np\nimport os.path\nfrom json import dumps as to_json\n"
        "a = np.arange(12, dtype=np.float16).reshape(3, 4).T\n"
        "d = {'k': [1, 2.5, 'text', None, b'raw'], (1, 2): {3j, -0.0}, 'n': np.int64(7)}\n"
        "class Model:\n    pass\n"
        "m = Model()\n"
    )
    user_ns: dict[str, Any] = {}
    outcome, sink, _ = run_cell(kube, cell, user_ns)
    assert outcome.status == "ok", outcome.error
    expected = np.arange(12, dtype=np.float16).reshape(3, 4).T
    assert user_ns["a"].dtype == np.float16 and np.array_equal(user_ns["a"], expected)
    assert user_ns["d"] == {"k": [1, 2.5, "text", None, b"raw"], (1, 2): {3j, -0.0}, "n": 7}
    assert "m" not in user_ns and "Model" not in user_ns
    warned = [n for n in sink.notices if "cannot come back from an untrusted cluster" in n]
    assert {n.split("`")[1] for n in warned} == {"m", "Model"}, warned
    assert any("`m`" in n and "Model" in n and "trusted cluster" in n for n in warned), sink.notices
    # what the cell imported, the kernel imports itself (modules never travel in the safe format)
    import json
    import os

    assert (user_ns["np"], user_ns["os"], user_ns["to_json"]) == (np, os, json.dumps)


def test_a_required_output_that_cannot_come_back_fails_and_overwrites_nothing(kube: KubernetesBackend) -> None:
    user_ns: dict[str, Any] = {"m": "mine", "n": 0}
    cell = "n = 1\nclass Model:\n    pass\nm = Model()"
    from gpu_offload.engine.analysis import analyse_cell
    from gpu_offload.engine.backends.base import RunRequest
    from gpu_offload.engine.bundle import build_job
    from gpu_offload.engine.engine import FollowSettings, Intake, conclude, follow
    from gpu_offload.engine.trust.intake import Wanted

    analysis = analyse_cell(cell, user_ns, extra_outputs=("m",))
    job, _ = build_job(cell, analysis, user_ns, kube.transfer, request=RunRequest(gpus=1))
    run = kube.submit(job)
    try:
        outcome = follow(run, Sink(), FollowSettings(grace=10.0),
                         Intake(kube.trusts, Wanted(analysis.outputs, analysis.required_outputs)))
    finally:
        run.release(10.0)
    assert outcome.status == "error"
    assert "asked for with --out" in str(outcome.error) and "trusted cluster" in str(outcome.error)
    with pytest.raises(Exception, match="Model"):
        conclude(outcome, user_ns)
    assert user_ns == {"m": "mine", "n": 0}


def test_a_dataframe_and_a_figure_come_back_from_an_untrusted_donor(kube: KubernetesBackend) -> None:
    cell = (
        "import pandas as pd, matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n"
        "df = pd.DataFrame({'loss': [0.5, 0.25]}, index=pd.Index(['a', 'b'], name='step'))\n"
        "plt.plot([1, 2, 3])\nplt.show()\n"
        "display(HTML('<p>done</p><script>alert(1)</script>'))\n"
    )
    user_ns: dict[str, Any] = {}
    outcome, sink, _ = run_cell(kube, cell, user_ns, image=PROJECT_IMAGE)
    assert outcome.status == "ok", outcome.error
    import pandas as pd

    pd.testing.assert_frame_equal(user_ns["df"], pd.DataFrame({"loss": [0.5, 0.25]},
                                                              index=pd.Index(["a", "b"], name="step")))
    figure, html = sink.displays_with_metadata
    assert "image/png" in figure[0] and figure[1]["trusted"] is False
    assert "<p>done</p>" in html[0]["text/html"] and "script" not in html[0]["text/html"]


def test_trusted_only_with_only_untrusted_donors_fails_before_launch(kube: KubernetesBackend, core: Any,
                                                                     namespace: str) -> None:
    with pytest.raises(OffloadUsageError, match=r"Nothing was launched: only trusted clusters were asked for and no "
                       r"peered cluster is trusted \(donor-1, donor-2 are untrusted\).*GPU_OFFLOAD_TRUSTED_CLUSTERS"
                       r".*without --trusted-only"):
        run_cell(kube, "y = 1", {}, trusted_only=True)
    assert not leftovers(core, namespace)


@pytest.fixture()
def kube_trusting_donor_1(api_client: Any, namespace: str, core: Any) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(settings(namespace, trusted=("donor-1",)), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)


def test_trusted_only_lands_on_the_trusted_donor_and_its_outputs_are_pickles(
        kube_trusting_donor_1: KubernetesBackend) -> None:
    user_ns: dict[str, Any] = {}
    cell = "class Model:\n    pass\nm = Model()\nm.size = 3"
    outcome, sink, run = run_cell(kube_trusting_donor_1, cell, user_ns, trusted_only=True)
    assert outcome.status == "ok", outcome.error
    assert run.current.ctx.cluster == "donor-1"  # donor-2 has more free GPUs, but is not trusted
    assert user_ns["m"].size == 3  # a class of the cell's own comes back from a trusted cluster
    assert not [n for n in sink.notices if "untrusted" in n]


@pytest.fixture()
def kube_s3(api_client: Any, namespace: str, s3: Any, s3_endpoint: str, core: Any) -> Iterator[KubernetesBackend]:
    from gpu_offload.engine.backends.kube.config import StorageSettings

    from .conftest import BUCKET

    backend = KubernetesBackend(settings(namespace, storage=StorageSettings(BUCKET, s3_endpoint)), api_client)
    yield backend
    backend.close()
    wait_until(lambda: not leftovers(core, namespace), "no pod or Secret left behind", timeout=60)


def test_with_object_storage_only_the_runs_own_uploads_are_read(kube_s3: KubernetesBackend, s3: Any,
                                                                 listener: tuple[str, list[str]]) -> None:
    from .conftest import BUCKET

    url, asked = listener
    # another run's object in the same bucket: a donor naming it must not get it loaded
    s3.put_object(Bucket=BUCKET, Key="gpu-offload/other-run/out-0", Body=b"GPUOSAFE1\n" + bytes(6))
    for target in (url, f"{kube_s3.storage.settings.endpoint}/{BUCKET}/gpu-offload/other-run/out-0"):  # type: ignore[union-attr]
        with pytest.raises(UntrustedOutputs, match="a runner pod named a URL that is not one of its run's uploads"):
            _evil(kube_s3, "url", {"x": 1}, EVIL_URL=target)
    assert asked == []
    # ordinary values still travel through the run's own uploads in the safe format
    user_ns: dict[str, Any] = {}
    outcome, _, _ = run_cell(kube_s3, "import numpy as np\nbig = np.ones((512, 1024))", user_ns)
    assert outcome.status == "ok", outcome.error
    assert user_ns["big"].shape == (512, 1024) and float(user_ns["big"].sum()) == 512 * 1024
    s3.delete_object(Bucket=BUCKET, Key="gpu-offload/other-run/out-0")  # the session's bucket is left empty
