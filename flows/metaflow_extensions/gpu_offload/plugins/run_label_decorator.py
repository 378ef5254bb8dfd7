"""Internal step decorator added by ``@gpu_offload``: labels a ``run``'s step pods with the run id."""

from __future__ import annotations

from typing import Any

from metaflow.decorators import StepDecorator


class GpuOffloadInternalDecorator(StepDecorator):
    """Not for users: ``@gpu_offload`` adds it after ``@kubernetes``, whose command it completes."""

    name = "gpu_offload_internal"

    def runtime_step_cli(self, cli_args: Any, retry_count: Any, max_user_code_retries: Any, ubf_context: Any) -> None:
        from gpu_offload.flows.run_label import add_run_label

        add_run_label(cli_args.commands, cli_args.command_options)
