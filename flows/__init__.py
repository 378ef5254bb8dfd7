"""Metaflow integration: `@gpu_offload` steps land on Liqo virtual nodes."""
