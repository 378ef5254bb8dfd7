"""Which origin configurations the session's pool treats as one (and so starts once in a run)."""

from __future__ import annotations

from pathlib import Path

from gpu_offload.sandbox.fixtures import origin_key
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.liqo import seed as liqo

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"


def test_one_configuration_written_two_ways_is_one_origin() -> None:
    as_count = origin_key(SHARED / "liqo-crds", 2, 4, "A100", {})
    as_donors = origin_key([SHARED / ".." / "shared" / "liqo-crds"], liqo.donors(2), 4, "A100", {})
    assert as_count == as_donors


def test_kueue_and_its_options_make_other_origins() -> None:
    crds = (SHARED / "liqo-crds", SHARED / "kueue-crds")
    plain = origin_key(crds, 1, 1, "A100", {})
    queued = origin_key(crds, 1, 1, "A100", {"kueue": KueueOptions()})
    sampled = origin_key(crds, 1, 1, "A100", {"kueue": KueueOptions(usage_sampling=36000.0)})
    assert len({plain, queued, sampled}) == 3
    assert queued == origin_key(list(crds), 1, 1, "A100", {"kueue": KueueOptions()})
