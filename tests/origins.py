"""The sandbox origin configurations the end-to-end lane shares, each named once (docs/testing.md's table).

The session's pool (``gpu_offload.sandbox.fixtures.origin_pool``) starts one origin per configuration (CRDs and
options; Kueue's options for the queued ones) and keeps the tests of a configuration on one xdist worker, so every
module below that names the same configuration shares one origin start-up in the whole lane. The donors are not
part of it: each module peers its own into the shared origin for its scope and they are unpeered after it, as Liqo
peers at run time (``sandbox/liqo/peering.py``), so ``PEERED.with_donors(...)`` is still ``PEERED``'s origin. A module or conftest takes one as::

    origin = PEERED.fixture()                       # Liqo's real CRDs, an A100 donor and an L4 donor

and a module whose tests also run on the real cluster (tests/realcluster) takes the queued ones through
``tests/engine/kube/conftest.py``'s ``kueue_origin_on_each_cluster``. A configuration here is shared: a module
leaves it as it found it, which the pool checks after each module (``sandbox/leftovers.py``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from gpu_offload.sandbox.fixtures import OriginPool, origin_fixture, pooled_as
from gpu_offload.sandbox.kubelet.images import DEFAULT_MAP
from gpu_offload.sandbox.kueue import KueueOptions
from gpu_offload.sandbox.kueue.pooled import kueue_origin_key, pooled_kueue_origin
from gpu_offload.sandbox.liqo import seed as liqo
from gpu_offload.sandbox.liqo.origin import RunningOrigin

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / ".." / "shared"
LIQO_CRDS = SHARED / "liqo-crds"
KUEUE_CRDS = SHARED / "kueue-crds"
NODE_BIN = REPO / ".ci" / "node" / "node_modules" / ".bin"
OTHER_PYTHON = Path("/root/.pyenv/versions/3.12.1/bin/python3")
MISMATCH_IMAGE = "python:3.12-other"
EVIL_IMAGE = "evil-donor:1"


def _evil_python() -> Path:
    """An "interpreter" that runs ``evil_donor.py`` (a hostile donor's runner) whatever it is asked to run."""
    folder = Path(tempfile.mkdtemp(prefix="gpuo-evil-"))
    folder.chmod(0o755)  # runner pods run as a non-root user: the image's "interpreter" must be theirs to run
    script = folder / "evil-python"
    donor = REPO / "tests" / "engine" / "kube" / "evil_donor.py"
    # a Python script, so the sandbox lets its non-root container reach the interpreter its #! line names
    script.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv = [{str(donor)!r}, *sys.argv[1:]]\n"
                      f"runpy.run_path({str(donor)!r}, run_name='__main__')\n")
    script.chmod(0o755)
    return script


# An image whose Python is another minor version than the kernel's (the kube tests' mismatch test), and a hostile
# donor's image (their attack tests), before the default map: the images every other test names resolve as in the
# default map, so modules that use neither share the origin of the modules that do.
IMAGE_MAP = ((MISMATCH_IMAGE, str(OTHER_PYTHON)), (EVIL_IMAGE, str(_evil_python())), *DEFAULT_MAP)
TWO_MODELS = (liqo.Donor("donor-1", 4, "A100", "2.00"), liqo.Donor("donor-2", 8, "L4", "0.80"))


@dataclass(frozen=True)
class OriginConfig:
    """One origin configuration: Liqo's CRDs or the built-in description, the donors, the origin's options."""

    donors: tuple[liqo.Donor, ...]
    crds: Path | None = LIQO_CRDS
    options: dict[str, Any] = field(default_factory=dict)

    def fixture(self, scope: str = "module") -> Any:
        """The module's ``origin`` fixture: this configuration's origin from the session's pool, its donors peered
        for the module's scope."""
        return origin_fixture(self.crds, donors=self.donors, scope=scope, **self.options)

    def with_donors(self, donors: tuple[liqo.Donor, ...]) -> OriginConfig:
        """The same origin with other donors peered for the module: the pool starts one origin per CRDs and
        options, and each module peers its own donors into it and unpeers them after."""
        return OriginConfig(donors, self.crds, self.options)


@dataclass(frozen=True)
class KueueConfig:
    """An origin with Kueue: Liqo's and Kueue's CRDs, the donors, Kueue's options, the kube tests' images. The
    donors are peered and Kueue's options set per module, so every ``KueueConfig`` shares one origin."""

    donors: tuple[liqo.Donor, ...]
    kueue: KueueOptions | None = None

    def pool_options(self) -> dict[str, Any]:
        """What ``sandbox.kueue.pooled`` takes for this configuration."""
        return {"donors": self.donors, "crds": [LIQO_CRDS, KUEUE_CRDS], "image_map": IMAGE_MAP, "kueue": self.kueue}

    def fixture(self, name: str = "origin") -> Any:
        """The ``origin`` (or ``name``) of a queued module that runs on the sandbox only: the session's origin with Kueue of these
        options, this configuration's donors peered for the module; after it its queue pool is deleted, the origin
        checked and the donors unpeered. (A module whose tests also run on the real cluster takes
        ``kueue_origin_on_each_cluster`` of tests/engine/kube/conftest.py.)"""
        options = self.pool_options()

        @pytest.fixture(scope="module", name=name)
        @pooled_as(kueue_origin_key(**options))
        def origin(request: pytest.FixtureRequest, origin_pool: OriginPool) -> Iterator[RunningOrigin]:
            with pooled_kueue_origin(origin_pool, request.node.nodeid, **options) as (running, _):
                yield running
        return origin

    def with_donors(self, donors: tuple[liqo.Donor, ...]) -> KueueConfig:
        """The same origin (Kueue's options) with other donors peered for the module."""
        return KueueConfig(donors, self.kueue)


PEERED = OriginConfig(TWO_MODELS, options={"image_map": IMAGE_MAP})
"""Liqo's real CRDs, an A100 donor and a cheaper L4 donor: the kubernetes backend's tests (tests/engine/kube), the
Liqo client's against a live API (tests/liqo_peering) and the panel's."""

TWO_A100 = OriginConfig(liqo.donors(2), options={"tool_dirs": (NODE_BIN,)})
"""Liqo's real CRDs, two donors of 4 A100, npm's tools (hub images' configurable-http-proxy) found in .ci/node: the
Liqo behaviour and label tests, every hub module but the queue pages', and the kubelet's and API server's tests
(tests/sandbox/conftest.py; with other donors: test_scheduling, test_devices)."""

ONE_A100_PAIR_QUEUED = KueueConfig((liqo.Donor("donor-1", 2, "A100", "2.00"),))
"""Kueue and one donor of two A100: preemption (its pool lowers the quota to 1) and a two-rank run that fits only
once the holder is gone (tests/engine/kube/test_preemption.py, test_queued_distributed.py)."""

MANAGED = {"matchLabels": {"gpu-offload.io/user-namespace": "true"}}
"""Kueue's ``managedJobsNamespaceSelector`` as docs/queueing.md has an admin set it (the real cluster's too)."""

QUEUED_ONE_EACH = KueueConfig((liqo.Donor("donor-1", 1, "A100", "2.00"), liqo.Donor("donor-2", 1, "L4", "0.80")),
                              KueueOptions(namespace_selector=MANAGED, usage_sampling=36000.0))
"""Kueue managing the user namespaces and one GPU on each of two donors: the queueing tests and Kueue's contract
(tests/engine/kube/test_queueing.py, test_kueue_contract.py)."""

SAMPLED = KueueOptions(usage_sampling=36000.0)
"""Kueue sampling usage once in ten hours: no fair-sharing sample lands during a module, so admission order is
only the queues' (test_mixed_pool, test_whole_queued, the three fractions modules)."""

QUEUED = KueueConfig(ONE_A100_PAIR_QUEUED.donors)
"""Kueue of its default options, for modules that peer donors of their own: ``QUEUED.with_donors(...)``. Every
queued configuration here is one origin in the lane (Liqo's and Kueue's CRDs, the kube tests' image map): each
module peers its donors into it and the pool restarts Kueue with the module's options when they differ."""
