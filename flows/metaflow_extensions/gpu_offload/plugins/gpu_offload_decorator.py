"""``@gpu_offload``: the Metaflow-facing shim. The logic lives in ``gpu_offload.flows``.

Metaflow imports this module while ``import metaflow`` is still running, so ``gpu_offload.flows`` (which
imports Metaflow) is imported only when a decorator is used: no import cycle, and a plain
``import metaflow`` stays as fast as without the extension.
"""

from __future__ import annotations

from typing import Any

from metaflow.user_decorators.user_step_decorator import StepMutator


class GpuOffloadDecorator(StepMutator):
    """Run this step on a GPU lent by a Liqo-peered cluster (adds or merges ``@kubernetes``).

    Parameters
    ----------
    gpus : int or float, default 1
        Number of GPUs for the step, or part of one (``gpus=0.5``): asked for in the units the donor lends GPUs
        in (shares, a MIG profile, an isolator's memory; docs/sharing.md).
    gpu_memory : str, optional, default None
        GPU memory the step needs of one GPU (``"12Gi"``): part of a GPU that holds it.
    gpu_model : str, optional, default None
        GPU model as admins label virtual nodes (``gpu-offload.io/gpu-model``), e.g. ``A100``.
    cluster : str, default "auto"
        Peered cluster id or ForeignCluster name, or ``auto`` to let placement choose.
    untrusted_ok : bool, default False
        Allow clusters the origin does not trust (``GPU_OFFLOAD_TRUSTED_CLUSTERS``). Off by default: the
        step's artifacts are pickles its pod writes, which later steps and notebooks load.
    priority : str, optional, default None
        Kueue priority class of the step's Job when steps queue through Kueue (``METAFLOW_GPU_OFFLOAD_QUEUE``
        or the hub's ``GPU_OFFLOAD_QUEUE``), e.g. ``batch``; None: the deployment's default.
    """

    # The name users write: `@gpu_offload` and `--with gpu_offload`.
    _decorator_name = "gpu_offload"

    def init(self, *args: Any, **kwargs: Any) -> None:
        # Metaflow requires `init` for a mutator that takes arguments; they are read in `mutate`, where the
        # step's name is known for error messages.
        pass

    def mutate(self, mutable_step: Any) -> None:
        from gpu_offload.flows.mutation import MutatorState, mutate_step

        # A `--with gpu_offload:...` mutator can reach mutate before Metaflow ran external_init (which
        # resolves config expressions in the arguments); it is idempotent.
        self.external_init()
        args, kwargs = self.get_args_kwargs()
        # Kept on the instance: Metaflow may call mutate again, and the state holds the user's originals.
        state = self.__dict__.setdefault("_offload_state", MutatorState())
        mutate_step(mutable_step, self._my_step, args, kwargs, state)

    def add_to_package(self) -> Any:
        from gpu_offload.flows.packaging import code_package_files

        # The step's pod runs this mutator again; it needs gpu_offload.flows there, and a stock image
        # does not have it.
        return code_package_files()
