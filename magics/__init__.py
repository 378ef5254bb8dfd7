"""The `%%gpu_offload` magic, its engine, the runner and the backends."""
