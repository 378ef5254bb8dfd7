"""jupyter-gpu-offload: run notebook cells and Metaflow steps on GPUs lent by Liqo-peered clusters.

Sub-packages (each built from a top-level folder of the repository):

- ``gpu_offload.magics``: the ``%%gpu_offload`` magic, its engine, the runner and the backends;
- ``gpu_offload.liqo_peering``: cluster inventory, placement and Liqo objects (the base layer);
- ``gpu_offload.flows``: the Metaflow integration;
- ``gpu_offload.hub_extension``: the JupyterHub service and spawner hooks;
- ``gpu_offload.sandbox``: a Kubernetes API emulator with Liqo donors, for tests and trying it out.
"""

__version__ = "0.1.0"
