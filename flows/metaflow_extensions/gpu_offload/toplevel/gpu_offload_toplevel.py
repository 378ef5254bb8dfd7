"""Makes ``from metaflow import gpu_offload`` work; importing it also registers ``--with gpu_offload``."""

from importlib import metadata

from metaflow_extensions.gpu_offload.plugins.gpu_offload_decorator import GpuOffloadDecorator as gpu_offload

__all__ = ["gpu_offload"]

# Shown in Metaflow's banner ("Metaflow 2.19.x+gpu-offload(0.1.0)"). A step's pod has the code package,
# not the distribution, so the version may be unknown there.
__mf_extensions__ = "gpu-offload"
try:
    __version__ = metadata.version("jupyter-gpu-offload")
except metadata.PackageNotFoundError:
    __version__ = "unknown"
