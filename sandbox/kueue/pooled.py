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
    """Kueue as part of a pooled origin, started with ``kueue`` options. Its options are not part of the origin's
    configuration: a module asking for others restarts it with them (:func:`pooled_kueue_origin`)."""
    options = kueue or KueueOptions()

    def make() -> tuple[Kueue, Any]:
        made = Kueue(options)
        return made, made.plugin
    return Addon("kueue", make)


def kueue_origin_key(donors: int | Sequence[liqo.Donor] = 2, gpus: int = 4, gpu_model: str = "A100",
                     crds: Sequence[Path] = (), kueue: KueueOptions | None = None, **options: Any) -> str:
    """The pool's key of that Kueue origin, for :func:`~gpu_offload.sandbox.fixtures.pooled_as`: its CRDs and
    options; the donors (peered per module) and Kueue's options (a module's restart Kueue) are not part of it."""
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
    """The session's origin with Kueue for these CRDs and options, for ``module``, as :func:`running_kueue_origin`
    gives one of its own: shared by every module asking for the same, Kueue restarted with ``kueue`` options if it
    runs with others, ``donors`` peered for the module. Afterwards the module's queue pool is deleted, the origin must
    be as the module found it, and its donors are unpeered (``fixtures.SharedOrigin.lent``)."""
    shared = pool.shared(list(crds), addon=kueue_addon(kueue), **options)
    wanted = kueue or KueueOptions()
    if shared.addon.options != wanted:
        if shared.holders:
            raise RuntimeError(f"{module} asks for Kueue with {wanted!r} while {shared.holders[0]} holds it with "
                               f"{shared.addon.options!r}: make that fixture module-scoped")

        async def restart() -> None:  # as an admin applies another Configuration and restarts Kueue's manager
            shared.addon.restart(wanted)
        shared.running.call(restart())
    with shared.lent(donor_list(donors, gpus, gpu_model), module, cleanup=lambda: remove_pool(shared.running)):
        yield shared.running, shared.addon
