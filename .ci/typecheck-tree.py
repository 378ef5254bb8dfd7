"""Build .typecheck/gpu_offload: the installed layout as symlinks, for mypy and import-linter.

Both tools read packages from disk and do not follow setuptools' editable-install mapping. The folders come
from setup.py's ROOTS through .ci/layout.py.
"""

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout import ROOT, roots  # noqa: E402 (a sibling script, not a package)

TREE = ROOT / ".typecheck" / "gpu_offload"
shutil.rmtree(TREE.parent, ignore_errors=True)
TREE.mkdir(parents=True)
for package, folder in roots().items():
    if package == "gpu_offload":
        for item in (ROOT / folder).iterdir():
            (TREE / item.name).symlink_to(item)
    elif package.startswith("gpu_offload."):
        (TREE / package.removeprefix("gpu_offload.")).symlink_to(ROOT / folder, target_is_directory=True)
print(TREE)
