"""A hostile donor's "runner": what whoever runs the pod on an untrusted cluster can do, played in the sandbox.

The sandbox's kubelet starts it in place of the image's Python (image ``evil-donor:*``). Like a donor, it
reads what the pod gets (the bundle on its stdin: nonce, run id, upload URLs) and its environment, and writes to the
pod's log well-formed frames with crafted contents, chosen by ``EVIL_MODE``:

- ``pickle``: outputs as a pickle whose loading runs code (it would write ``EVIL_MARKER``);
- ``shm``: outputs claiming the safe format, held in "shared memory" at ``EVIL_VICTIM`` (a file of the
  kernel's: loading would map it, then unlink it);
- ``url``: outputs claiming the safe format, at ``EVIL_URL`` (not one of the run's uploads);
- ``display``: rich output with script, an event handler and a JavaScript bundle, beside a real PNG;
- ``oversize``: safe outputs uploaded to the run's first output URL, 4 MiB where the frame declares 64 bytes
  (with the sha256 of what it uploaded);
- ``stored-pickle``: a pickle of 4 MiB uploaded to the run's first output URL, named by the frame (which
  the kernel will refuse: a download of it is memory and time spent on nothing);
- ``metrics``: a ``metrics`` frame whose note is an object, not text, then ordinary safe outputs.

A cell can choose the mode itself with a first line ``# EVIL_MODE=<mode>`` (the magic sets no pod
environment).
"""

from __future__ import annotations

import base64
import os
import pickle
import sys

from gpu_offload.runner.wire import FrameEncoder

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000")  # a PNG's first bytes


class Payload:
    """Unpickling this runs ``exec`` with the donor's code."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (self.code,))


def write(data: bytes) -> None:
    os.write(1, data)


def outputs(mode: str, names: list[str]) -> dict[str, object]:
    if mode == "pickle":
        code = f"open({os.environ['EVIL_MARKER']!r}, 'w').write('the donor ran code in your kernel')"
        packed = base64.b64encode(pickle.dumps({name: Payload(code) for name in names})).decode()
        return {"names": names, "pickle": packed, "buffers": []}
    if mode == "shm":
        victim = os.environ["EVIL_VICTIM"]
        ref = {"kind": "shm", "path": victim, "size": os.path.getsize(victim) if os.path.exists(victim) else 5}
        return {"names": names, "pickle": ref, "buffers": [dict(ref)], "format": "safe"}
    ref = {"kind": "url", "url": os.environ["EVIL_URL"], "size": 16, "index": 0}
    return {"names": names, "pickle": ref, "buffers": [], "format": "safe"}


def main() -> int:
    bundle_path = sys.argv[sys.argv.index("--bundle") + 1]
    with open(0 if bundle_path == "-" else bundle_path, "rb") as handle:
        bundle = pickle.load(handle)  # the donor's own process reads what the kernel sent it (on its stdin)
    first = str(bundle.get("cell", "")).partition("\n")[0]
    mode = os.environ.get("EVIL_MODE") or first.removeprefix("# EVIL_MODE=")
    encoder = FrameEncoder(bundle["nonce"], write)
    python = ".".join(str(part) for part in sys.version_info[:3])
    encoder.emit("hello", python=python, pid=os.getpid(), gpus=[], session=False)
    encoder.begin_run(bundle["run_id"])
    if mode == "display":
        html = '<b id="kept">numbers</b><script>fetch("/api/contents")</script><img src=x onerror="alert(1)">'
        data = {"text/html": html, "image/png": base64.b64encode(PNG).decode(),
                "application/javascript": "alert(document.cookie)", "text/plain": "<figure>"}
        encoder.emit("display_data", data=data, metadata={"isolated": False})
    elif mode in ("oversize", "stored-pickle"):
        import hashlib

        from gpu_offload.runner.buffers import _put
        from gpu_offload.runner.safe import encode

        names = list(dict.fromkeys([*bundle["outputs"], *bundle["required_outputs"]]))
        safe = mode == "oversize"
        data = encode({n: bytes(4 << 20) for n in names}).tobytes() if safe else pickle.dumps(bytes(4 << 20))
        url = bundle["output_urls"][0]
        _put(url, memoryview(data))  # as the runner uploads
        ref = {"kind": "url", "url": url, "size": 64 if safe else len(data), "index": 0,
               "sha256": hashlib.sha256(data).hexdigest()}
        encoder.emit("outputs", names=names, pickle=ref, buffers=[], format="safe" if safe else "pickle")
    elif mode == "metrics":
        from gpu_offload.runner.safe import encode

        encoder.emit("metrics", gpu=[], note={"html": "<b>not text</b>"})
        names = list(dict.fromkeys([*bundle["outputs"], *bundle["required_outputs"]]))
        container = base64.b64encode(encode({name: 1 for name in names}).tobytes()).decode()
        encoder.emit("outputs", names=names, pickle=container, buffers=[], format="safe")
    else:
        names = list(dict.fromkeys([*bundle["outputs"], *bundle["required_outputs"]]))
        encoder.emit("outputs", **outputs(mode, names))
    encoder.emit("done", status="ok", elapsed=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
