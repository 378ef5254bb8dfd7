"""kubespawner hooks: the user's offloaded namespace, its policies, and the profiles offered."""
