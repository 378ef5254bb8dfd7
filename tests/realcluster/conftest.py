"""The real-cluster tests of this folder are collected only in the real-cluster stage (tests/realcluster/run.sh
sets GPU_OFFLOAD_REAL_CLUSTER=1 after up.sh): the main suite has no cluster to run them on."""

from __future__ import annotations

from .realorigin import ENABLED

collect_ignore_glob = [] if ENABLED else ["test_*.py"]
