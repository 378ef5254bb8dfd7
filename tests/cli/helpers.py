"""Running ``gpu-offload`` as a user would: a child process with its own environment and working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

CLUSTER_VARIABLES = ("GPU_OFFLOAD_NAMESPACE", "GPU_OFFLOAD_BACKEND", "KUBECONFIG", "GPU_OFFLOAD_SERVER_ID",
                     "GPU_OFFLOAD_S3_BUCKET", "GPU_OFFLOAD_S3_ENDPOINT")


def environment(state: Path, **extra: str) -> dict[str, str]:
    """This process's environment without cluster settings, with its own state directory and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    return {**env, "GPU_OFFLOAD_STATE_DIR": str(state), **extra}


def argv(*words: str) -> list[str]:
    """The command line of ``gpu-offload WORDS``."""
    return [sys.executable, "-m", "gpu_offload.cli", *words]


def cli(words: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``gpu-offload WORDS`` to its end."""
    return subprocess.run(argv(*words), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout)


def write_project(root: Path) -> Path:
    """A script with a local import, a small data file and a .gitignored big file; returns the script."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "helper.py").write_text("GREETING = 'hello from helper'\n")
    (root / "data.txt").write_text("small data\n")
    (root / ".gitignore").write_text("big.bin\n")
    (root / "big.bin").write_bytes(b"\0" * (12 * 2**20))  # over the default cap: only .gitignore lets it pass
    script = root / "main.py"
    script.write_text(
        "import os, sys\n"
        "from helper import GREETING\n"
        "print(GREETING, open('data.txt').read().strip(), __name__, sys.argv[1:], flush=True)\n"
        "print('big.bin shipped' if os.path.exists('big.bin') else 'big.bin left home', flush=True)\n"
        "if sys.argv[1:2] == ['exit']:\n    sys.exit(int(sys.argv[2]))\n"
        "if sys.argv[1:2] == ['raise']:\n    raise ValueError('boom from the script')\n"
        "if sys.argv[1:2] == ['sleep']:\n"
        "    import time\n"
        "    for i in range(600):\n        print('tick', i, flush=True); time.sleep(0.2)\n"
    )
    return script
