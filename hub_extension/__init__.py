"""JupyterHub integration: the admin peering service, spawner hooks."""
