"""``@gpu_offload``: the Metaflow-facing shim. The logic lives in ``gpu_offload.flows``."""

from __future__ import annotations

from typing import Any

from gpu_offload.flows.mutation import MutatorState, mutate_step
from gpu_offload.flows.packaging import code_package_files
from metaflow.user_decorators.user_step_decorator import StepMutator


class GpuOffloadDecorator(StepMutator):
    """Run this step on a GPU lent by a Liqo-peered cluster (adds or merges ``@kubernetes``).

    Parameters
    ----------
    gpus : int, default 1
        Number of GPUs for the step.
    gpu_model : str, optional, default None
        GPU model as admins label virtual nodes (``gpu-offload.io/gpu-model``), e.g. ``A100``.
    cluster : str, default "auto"
        Peered cluster id or ForeignCluster name, or ``auto`` to let placement choose.
    """

    # The name users write: `@gpu_offload` and `--with gpu_offload`.
    _decorator_name = "gpu_offload"

    def init(self, *args: Any, **kwargs: Any) -> None:
        # Checked in mutate, where the step's name is known and the error can name it.
        self._offload_args = args
        self._offload_kwargs = kwargs
        self._offload_state = MutatorState()

    def mutate(self, mutable_step: Any) -> None:
        if not hasattr(self, "_offload_state"):  # bare `@gpu_offload`: Metaflow calls no init then
            self.init()
        mutate_step(mutable_step, self._my_step, self._offload_args, self._offload_kwargs, self._offload_state)

    def add_to_package(self) -> Any:
        # The step's pod runs this mutator again; it needs gpu_offload.flows there, and a stock image
        # does not have it.
        return code_package_files()
