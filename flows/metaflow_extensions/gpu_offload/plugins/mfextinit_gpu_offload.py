"""Metaflow's plugin entry for this extension (``metaflow_extensions.gpu_offload.plugins``).

``STEP_DECORATORS_DESC`` lists classic ``StepDecorator`` classes, which Metaflow instantiates with
attributes. ``@gpu_offload`` itself is a ``StepMutator``: Metaflow registers it by its class name when its
module is imported, so it is exported from ``toplevel/`` instead. Listed here is only the internal
decorator it adds to each offloaded step.
"""

STEP_DECORATORS_DESC = [
    ("gpu_offload_internal", ".run_label_decorator.GpuOffloadInternalDecorator"),
]
