"""Metaflow's plugin entry for this extension (``metaflow_extensions.gpu_offload.plugins``).

``STEP_DECORATORS_DESC`` lists ``StepDecorator`` classes only: Metaflow instantiates each of those as a
classic decorator. ``@gpu_offload`` is a ``StepMutator``, which Metaflow registers by class name as soon
as its module is imported, so it is exported from ``toplevel/`` instead and this list stays empty.
"""

STEP_DECORATORS_DESC: list[tuple[str, str]] = []
