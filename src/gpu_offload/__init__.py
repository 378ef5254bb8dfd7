"""jupyter-gpu-offload: run notebook cells and Metaflow steps on GPUs lent by Liqo-peered clusters.

Sub-packages (``engine``, ``runner`` and ``cli`` live in ``src/gpu_offload/``; setup.py maps each other top-level
folder of the repository onto one):

- ``gpu_offload.engine``: the request, the engine that follows runs, the backends and the trust boundary;
- ``gpu_offload.runner``: the program that runs offloaded cells on donors;
- ``gpu_offload.cli``: every ``gpu-offload`` sub-command;
- ``gpu_offload.magics``: the ``%%gpu_offload`` magic and its panel;
- ``gpu_offload.liqo_peering``: cluster inventory, placement and Liqo objects (the base layer);
- ``gpu_offload.flows``: the Metaflow integration;
- ``gpu_offload.hub_extension``: the JupyterHub service and spawner hooks;
- ``gpu_offload.sandbox``: a Kubernetes API emulator with Liqo donors, for tests and trying it out.
"""

__version__ = "0.1.0"
