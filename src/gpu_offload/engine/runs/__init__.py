"""The run book: every run's record in the user's state directory, written at the engine's event boundary
(``tracking``), read back with the runner pods of the user's other kernels and scripts (``listing``).

The panel, ``gpu-offload runs/logs/cancel`` and the runs REST API all read it; none of them writes a record.
"""
