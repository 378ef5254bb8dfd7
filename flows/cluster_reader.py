"""The only module of ``gpu_offload.flows`` that talks to an API server, through ``liqo_peering``'s clients.

It reads the inventory placement needs and refuses a target namespace that Liqo does not offload, since a
step pod there would stay Pending (OffloadingBackOff) instead of reaching a virtual node. Validation must
not hang on a cluster that is off: no client retries, a short timeout per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import GpuOffloadFlowError

if TYPE_CHECKING:
    from gpu_offload.liqo_peering.inventory import Inventory

TIMEOUT_SECONDS = 5.0
IN_CLUSTER = "<in-cluster>"


class ClusterUnreachable(GpuOffloadFlowError):
    """The API server did not answer (connection refused, DNS, timeout)."""


def unreachable(where: str, exc: Exception) -> ClusterUnreachable:
    return ClusterUnreachable(f"the cluster in {where} does not answer ({exc}); start it, or set "
                              "METAFLOW_GPU_OFFLOAD_PLACEMENT_SOURCE=config to place from configuration")


def _api_client(where: str) -> Any:
    """An ``ApiClient`` through the kubeconfig at ``where`` (or in-cluster), without client retries."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    try:
        if where == IN_CLUSTER:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(config_file=where, client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise GpuOffloadFlowError(f"the kubeconfig {where} cannot be used ({exc}); fix it or unset KUBECONFIG") from exc
    configuration.retries = 0
    return kubernetes.client.ApiClient(configuration)


def read_inventory(where: str, namespace: str | None) -> Inventory:
    """The live inventory through the kubeconfig at ``where`` (or in-cluster), checking ``namespace``."""
    from gpu_offload.liqo_peering.client import LiqoClient
    from gpu_offload.liqo_peering.errors import APIUnreachable, GpuOffloadError

    client = LiqoClient(_api_client(where), request_timeout=TIMEOUT_SECONDS)
    try:
        inventory = client.read_inventory()
        if namespace and client.read_offloading(namespace) is None:
            raise GpuOffloadFlowError(
                f"namespace {namespace!r} is not offloaded by Liqo (no NamespaceOffloading named 'offloading' "
                "in it), so step pods there would stay Pending; offload it (liqoctl offload namespace "
                f"{namespace}) or point METAFLOW_KUBERNETES_NAMESPACE / METAFLOW_GPU_OFFLOAD_NAMESPACE at one"
            )
    except APIUnreachable as exc:
        raise unreachable(where, exc) from exc
    except GpuOffloadError as exc:
        raise GpuOffloadFlowError(f"reading the Liqo inventory through {where}: {exc}") from exc
    return inventory


def read_local_queue(where: str, namespace: str) -> str | None:
    """The one Kueue LocalQueue of ``namespace``, found as a kernel finds its own (``the_local_queue``): None
    when there is none, no Kueue or no right to list them; several stop validation, saying how to choose."""
    from gpu_offload.liqo_peering import environment as E
    from gpu_offload.liqo_peering.errors import APIUnreachable, GpuOffloadError
    from gpu_offload.liqo_peering.queue_client import KueueClient, SeveralLocalQueues, the_local_queue

    try:
        return the_local_queue(KueueClient(_api_client(where), request_timeout=TIMEOUT_SECONDS), namespace)
    except SeveralLocalQueues as exc:
        raise GpuOffloadFlowError(
            f"neither {E.FLOW_QUEUE.name} nor {E.QUEUE.name} is set and {exc}, so the flow cannot tell which one "
            f"its @gpu_offload steps should wait in; name one, e.g. `export {E.FLOW_QUEUE.name}={exc.names[0]}` in "
            "the shell that runs the flow (or the same key in Metaflow's config), and run the flow again"
        ) from None
    except APIUnreachable as exc:
        raise unreachable(where, exc) from exc
    except GpuOffloadError as exc:
        raise GpuOffloadFlowError(f"listing the Kueue LocalQueues of {namespace} through {where}: {exc}") from exc


class StepJobs:
    """A flow run's step Jobs in ``namespace`` (those labelled ``selector``) and what Kueue says of them: the I/O
    of ``step_watch``. Reads never raise: what cannot be read is not said."""

    def __init__(self, where: str, namespace: str, selector: str) -> None:
        from gpu_offload.liqo_peering.queue_client import KueueClient

        self._api = _api_client(where)
        self._kueue = KueueClient(self._api, request_timeout=TIMEOUT_SECONDS)
        self.namespace = namespace
        self.collection = self._kueue.jobs(namespace, selector)

    def stop_message(self, name: str, uid: str) -> str | None:
        """The message of the ``Stopped`` event Kueue recorded on the Job, None when there is none (yet)."""
        from gpu_offload.liqo_peering.errors import GpuOffloadError

        try:
            event = self._kueue.stop_event(self.namespace, "Job", name, uid)
        except GpuOffloadError:
            return None
        return None if event is None else str(event.get("message") or "")

    def place(self, queue: str, job_name: str) -> tuple[int, int] | None:
        """The Job's place in its LocalQueue (from 0) and the queue's length, from Kueue's visibility API; None
        when not listed (not requeued yet) or not readable."""
        from gpu_offload.liqo_peering.errors import GpuOffloadError

        try:
            pending = self._kueue.pending_workloads(self.namespace, queue)
        except GpuOffloadError:
            return None
        for item in pending:
            owners = (item.get("metadata") or {}).get("ownerReferences") or []
            if any(o.get("kind") == "Job" and o.get("name") == job_name for o in owners):
                position = item.get("positionInLocalQueue")
                return (position, len(pending)) if isinstance(position, int) and position >= 0 else None
        return None

    def close(self) -> None:
        self._api.close()
