"""Kueue, emulated in the sandbox (``gpu-offload sandbox --kueue``): its pod and Job webhooks, Workloads,
queueing with Admission Fair Sharing, flavor assignment, preemption within a ClusterQueue,
waitForPodsReady and the visibility API's pending workloads. What real Kueue does that this does not is
listed in docs/sandbox.md.

``Kueue(options).plugin`` goes into ``ApiServer(plugins=[...])``, after the Liqo origin's plugin when
pods should really run (the Kueue controller relies on the scheduler honouring scheduling gates).
``with kueue.outage():`` stands for Kueue's process being gone: its webhooks fail closed, nothing is admitted
or finalized, the visibility API answers 503; all resumes after the block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..server import ApiServer
from . import crds, names, webhook
from .controller import KueueController, run
from .options import KueueOptions
from .visibility import routes
from .webhook import Outage

__all__ = ["Kueue", "KueueOptions"]


@dataclass
class Kueue:
    """The Kueue plugin; ``controller`` holds the in-memory state (fair-sharing usage, queue order)."""

    options: KueueOptions = field(default_factory=KueueOptions)
    controller: KueueController = field(init=False)
    state: Outage = field(init=False, default_factory=Outage)

    def __post_init__(self) -> None:
        self.controller = KueueController(self.options, self.state)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Kueue down for the block, as when its process is killed, and back after it."""
        self.state.down = True
        try:
            yield
        finally:
            self.state.down = False

    def restart(self, options: KueueOptions) -> None:
        """Kueue started again with another Configuration, as an admin applies one and restarts Kueue's manager:
        the webhooks select namespaces by the new ``managedJobsNamespaceSelector``, and the controller's memory
        (fair-sharing usage, queue order) starts over. Call on the server's loop."""
        self.options = options
        self.controller.restart(options)

    def plugin(self, server: ApiServer) -> None:
        """Serve the Kueue kinds, install the webhooks, the controller and the visibility endpoints."""
        api = server.api
        for crd in crds.builtin_crds():
            if api.registry.by_kind(names.API_VERSION, crd["spec"]["names"]["kind"]) is None:
                api.registry.add_crd(crd)
        webhook.install(api, lambda: self.options.namespace_selector, self.state)
        routes(server.app, api, self.controller.queue_order.get, lambda: self.state.down)

        async def kueue_controller(api_: object) -> None:
            await run(server.api, self.controller)

        server.add_controller(kueue_controller)
