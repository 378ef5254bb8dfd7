"""The one error type of the Metaflow integration.

It subclasses Metaflow's own exception so that ``python flow.py ...`` prints it as a short headline and
message (not a traceback) and stops before anything is deployed or launched.
"""

from __future__ import annotations

from metaflow.exception import MetaflowException


class GpuOffloadFlowError(MetaflowException):
    """Bad ``@gpu_offload`` input or a placement that cannot be satisfied; the message says what to change."""

    headline = "@gpu_offload"

    def __init__(self, message: str) -> None:
        super().__init__(msg=message)
        self.message = message

    def __str__(self) -> str:
        return self.message
