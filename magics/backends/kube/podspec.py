"""Pure builders on top of ``liqo_peering.specs``: the runner pod of a cell, and the bundle as a pod needs it.

``specs.runner_pod`` already makes a restricted pod that runs the runner from its Secret; this adds what
only the magic knows: a memory limit, and a bootstrap that fetches a bundle too large for the Secret
from a presigned URL (the pod holds no storage credentials).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

from ....liqo_peering.specs import MOUNT_PATH, RUNNER_KEY, RunnerPodSpec, runner_pod

BUNDLE_URL_ENV = "GPU_OFFLOAD_BUNDLE_URL"
# Downloads the bundle into an unlinked temporary file and runs the runner on it through /dev/fd, so the
# bundle (it holds the frame nonce) never sits in a named file and nothing is left behind in the image.
BOOTSTRAP = (
    "import os,sys,tempfile,urllib.request\n"
    "f=tempfile.TemporaryFile()\n"
    f"with urllib.request.urlopen(os.environ.pop('{BUNDLE_URL_ENV}'),timeout=300) as r:\n"
    "    while True:\n"
    "        b=r.read(1<<20)\n"
    "        if not b: break\n"
    "        f.write(b)\n"
    "f.flush();os.lseek(f.fileno(),0,0);os.set_inheritable(f.fileno(),True)\n"
    "os.execv(sys.executable,[sys.executable,sys.argv[1],'--bundle','/dev/fd/%d'%f.fileno()])\n"
)


def cell_pod(spec: RunnerPodSpec, memory: str | None = None, bundle_url: str | None = None) -> dict[str, Any]:
    """The runner pod: ``specs.runner_pod`` plus a memory limit and, for a stored bundle, the bootstrap."""
    pod = runner_pod(spec)
    container = pod["spec"]["containers"][0]
    if memory:
        resources = container.setdefault("resources", {})
        resources.setdefault("limits", {})["memory"] = memory
        resources.setdefault("requests", {})["memory"] = memory
    if bundle_url is not None:
        container["command"] = [spec.python, "-I", "-c", BOOTSTRAP, f"{MOUNT_PATH}/{RUNNER_KEY}"]
        container["env"] = [*container["env"], {"name": BUNDLE_URL_ENV, "value": bundle_url}]
    return pod


def with_output_urls(bundle: bytes, urls: Sequence[str]) -> bytes:
    """The bundle with its outputs sent through object storage (``url`` transport) to ``urls``.

    The bundle is the engine's own stdlib pickle of plain types, so loading it here is safe.
    """
    data = pickle.loads(bundle)  # noqa: S301 - our own bytes, built by the engine a moment ago
    data["output_transport"] = "url"
    data["output_urls"] = list(urls)
    return pickle.dumps(data, protocol=5)


def fetched_outputs(outputs_pickle: Any, refs: Sequence[Mapping[str, Any]], read: Any) -> tuple[Any, list[Any]]:
    """The ``outputs`` frame's pickle and buffer refs with every ``url`` ref replaced by its bytes.

    ``read(index)`` returns the bytes of upload ``index``; the engine then loads them without the network.
    """

    def fetch(ref: Mapping[str, Any]) -> Any:
        if not isinstance(ref, Mapping) or ref.get("kind") != "url":
            return copy.deepcopy(ref)
        data = read(int(ref["index"]))
        return {"kind": "inline", "data": data, "size": len(data)}

    return fetch(outputs_pickle) if isinstance(outputs_pickle, Mapping) else outputs_pickle, [fetch(r) for r in refs]
