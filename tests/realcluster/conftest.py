"""The real-cluster tests of this folder are collected only in their own stages: the real-cluster stage
(tests/realcluster/run.sh sets GPU_OFFLOAD_REAL_CLUSTER=1 after up.sh) and the Liqo stage (tests/realcluster/liqo.sh
sets GPU_OFFLOAD_REAL_LIQO=1 once its pair is peered); the main suite has no cluster to run them on."""

from __future__ import annotations

from pathlib import Path

from .liqopair import ENABLED as LIQO_ENABLED
from .realorigin import ENABLED

LIQO_TESTS = {"test_real_liqo.py", "test_real_hub_path.py"}

collect_ignore = [str(path) for path in Path(__file__).parent.glob("test_*.py")
                  if not (LIQO_ENABLED if path.name in LIQO_TESTS else ENABLED)]
