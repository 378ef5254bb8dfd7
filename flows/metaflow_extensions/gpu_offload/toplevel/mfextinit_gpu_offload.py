"""Metaflow's top-level entry for this extension: names added to ``import metaflow``."""

toplevel = "gpu_offload_toplevel"
