"""Liqo inventory, placement and the objects the project writes: the base layer every front end uses."""
