"""The ``gpu-offload`` shell commands of the magic's engine: ``run``, ``runs``, ``logs``, ``cancel``, ``doctor``.

A front end like the magic: a script goes through the same request, bundle, backend and engine as a cell
(:mod:`gpu_offload.magics.execution`), and its runs are recorded where the panel reads a kernel's runs.
"""
