"""Internal step decorator added by ``@gpu_offload``: completes a ``run``'s ``kubernetes step`` command (the run
id label, the short toleration of a lost node) and, for a step that queues in Kueue, has the run process watch
its Job so a preemption is said (Metaflow says nothing while the step waits in line again)."""

from __future__ import annotations

from typing import Any

from metaflow.decorators import StepDecorator


class GpuOffloadInternalDecorator(StepDecorator):
    """Not for users: ``@gpu_offload`` adds it after ``@kubernetes``, whose command it completes."""

    name = "gpu_offload_internal"

    def runtime_step_cli(self, cli_args: Any, retry_count: Any, max_user_code_retries: Any, ubf_context: Any) -> None:
        from gpu_offload.flows.run_label import add_node_lost_tolerations, add_run_label
        from gpu_offload.flows.settings import metaflow_settings

        add_run_label(cli_args.commands, cli_args.command_options)
        add_node_lost_tolerations(cli_args.commands, cli_args.command_options, metaflow_settings().node_lost_seconds)
        from gpu_offload.flows.step_watch import watch_queued_step

        watch_queued_step(cli_args.commands, cli_args.command_options)

    def runtime_finished(self, exception: Any) -> None:
        from gpu_offload.flows.step_watch import stop_watches

        stop_watches()
