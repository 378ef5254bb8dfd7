"""Build .typecheck/gpu_offload: the installed layout as symlinks, for mypy and import-linter.

Both tools read packages from disk and do not follow setuptools' editable-install mapping.
"""

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".typecheck" / "gpu_offload"
SUBPACKAGES = ["magics", "liqo_peering", "flows", "hub_extension", "sandbox"]

shutil.rmtree(TREE.parent, ignore_errors=True)
TREE.mkdir(parents=True)
for item in (ROOT / "src" / "gpu_offload").iterdir():
    (TREE / item.name).symlink_to(item)
for name in SUBPACKAGES:
    (TREE / name).symlink_to(ROOT / name, target_is_directory=True)
print(TREE)
