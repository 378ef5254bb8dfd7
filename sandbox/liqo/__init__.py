"""Liqo emulated on the origin: the donors' objects, the virtual nodes, namespace offloading and the origin."""
