"""A Kubernetes API emulator with Liqo donors, a scheduler and a test kubelet. A SANDBOX, not a cluster."""
