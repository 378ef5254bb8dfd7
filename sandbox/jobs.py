"""Placeholder replaced below."""

from __future__ import annotations

from typing import Any


async def job_controller(api: Any) -> None:
    """Drive batch/v1 Jobs (filled in later in this module)."""
    return None
