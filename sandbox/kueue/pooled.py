"""Origins with Kueue shared by the test modules that ask for the same configuration (tests only; needs pytest).

A module's ``origin`` fixture takes the session's ``origin_pool`` and, for the sandbox, enters
:func:`pooled_kueue_origin`; :func:`~gpu_offload.sandbox.fixtures.pooled_as` with :func:`kueue_origin_key` keeps
the modules of one configuration on one xdist worker, so the origin starts once a run::

    @pytest.fixture(scope="module")
    @pooled_as(kueue_origin_key(**CONFIG))
    def origin(request, origin_pool):
        with pooled_kueue_origin(origin_pool, request.node.nodeid, **CONFIG) as (running, kueue):
            yield running
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..fixtures import Addon, OriginPool, donor_list, origin_key, wait_until
from ..liqo import seed as liqo
from ..liqo.origin import RunningOrigin
from . import Kueue, KueueOptions

KUEUE_GROUP = "kueue.x-k8s.io"


POOL_KINDS = ("clusterqueues", "resourceflavors", "workloadpriorityclasses")
"""Kueue's cluster-wide kinds an admin (``gpu-offload queues sync``) makes: the pool a module sets up."""


def kueue_addon(kueue: KueueOptions | None = None) -> Addon:
    """Kueue with ``kueue`` options as part of a pooled origin's configuration."""
    options = kueue or KueueOptions()

    def make() -> tuple[Kueue, Any]:
        made = Kueue(options)
        return made, made.plugin
    return Addon(f"kueue {options!r}", make)


def kueue_origin_key(donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4, gpu_model: str = "A100",
                     crds: Sequence[Path] = (), kueue: KueueOptions | None = None, **options: Any) -> str:
    """The pool's key of that Kueue origin, for :func:`~gpu_offload.sandbox.fixtures.pooled_as` (the donors are
    peered per module, so they are not part of it)."""
    return origin_key(list(crds), options, kueue_addon(kueue))


def remove_pool(running: RunningOrigin) -> None:
    """Delete the ClusterQueues, ResourceFlavors and WorkloadPriorityClasses a module made, as an admin would,
    and wait until Kueue's finalizers let them go (a flavor goes once no ClusterQueue uses it)."""
    import kubernetes

    client = running.sandbox.api_client()
    custom = kubernetes.client.CustomObjectsApi(client)
    try:
        for plural in POOL_KINDS:
            for item in custom.list_cluster_custom_object(KUEUE_GROUP, "v1beta2", plural)["items"]:
                custom.delete_cluster_custom_object(KUEUE_GROUP, "v1beta2", plural, item["metadata"]["name"])
        wait_until(lambda: not any(custom.list_cluster_custom_object(KUEUE_GROUP, "v1beta2", p)["items"]
                                   for p in POOL_KINDS), "Kueue's pool of the module to be deleted", timeout=60)
    finally:
        client.close()


@contextmanager
def pooled_kueue_origin(pool: OriginPool, module: str, donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4,
                        gpu_model: str = "A100", crds: Sequence[Path] = (), kueue: KueueOptions | None = None,
                        **options: Any) -> Iterator[tuple[RunningOrigin, Kueue]]:
    """The session's origin with Kueue of this configuration, for ``module``: shared by every module asking for the
    same, as :func:`running_kueue_origin` gives one of its own. Afterwards the module's queue pool is deleted and the
    origin must be as the module found it (``fixtures.SharedOrigin.check``)."""
    shared = pool.shared(list(crds), addon=kueue_addon(kueue), **options)
    with shared.lent(donor_list(donors, gpus, gpu_model), module, cleanup=lambda: remove_pool(shared.running)):
        yield shared.running, shared.addon
