"""The notebook users mixed into the trace replay of bench_sessions_replay.py: a documented, seeded model.

Nothing here is measured from real users; it is a plain model, written down so that a reader can disagree with
it, and drawn from one seeded stream so that every tree replayed sees the very same users, cells and gaps.

- **Sessions** (``%%gpu_offload --session``) start as a Poisson stream (:data:`SESSIONS_PER_DAY`); each is a
  light user's (share :data:`LIGHT_SHARE`) or a heavy user's.
- A **light user** explores: 1 GPU, the hub's default class (``interactive``), 3-12 cells of about 45 s of GPU
  time each (log-normal, at most 20 min), thinking about 2 min between cells, and with probability 0.15 a break of
  20 min to 4 h instead (a meeting, lunch). 30 % of them ask ``--idle-timeout 10`` (10 minutes).
- A **heavy user** trains: 1, 1, 2 or 4 GPUs at ``--priority batch``, 2-6 cells of about 15 min each (at most
  4 h), about 5 min between cells, and with probability 0.3 a break of 1-14 h instead (overnight). 20 % of them
  ask ``--idle-timeout 30``.
- After the last cell, 40 % close the session (``%gpu_offload close``); the others just leave, and the session
  sits idle until it is released or until :data:`LEFT_FOR` later (their server culled, its pods swept).
- **One-shot cells** (no ``--session``; ``gpu-offload run`` scripts): :data:`ONE_SHOTS_PER_DAY` of them at
  ``--priority batch``, about 20 min each, showing their first output after 0-2 min; 30 % ask
  ``--rerun-on-preemption``.

A user whose cell was cut off by a preemption sends it again at once, up to :data:`GIVE_UP` times in a row (a
session pod taken while waiting for a GPU or restoring counts too); then they give the session up.
A user whose session lost its variables (the tree keeps no checkpoint) runs the cells that made them again before
going on: their GPU time is the work lost. A cell that was running when its pod was taken is run again.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SESSIONS_PER_DAY = 40.0
LIGHT_SHARE = 0.7
ONE_SHOTS_PER_DAY = 12.0
LEFT_FOR = 8 * 3600.0
"""A user who left without closing: the session ends this long after their last cell (JupyterHub culls the idle
server, the orphan sweep removes its pods), whatever the tree does meanwhile."""
DAY = 86400.0
GIVE_UP = 3


@dataclass(frozen=True)
class Cell:
    gpu_seconds: float
    """GPU time the cell runs for, once it runs."""
    gap: float
    """Seconds the user thinks after the cell ended, before the next one (after the last: how long until the
    session ends if the user left; 0 if they close it)."""


@dataclass(frozen=True)
class SessionUser:
    index: int
    start: float
    light: bool
    gpus: int
    priority: str
    idle_ask: float | None
    """``--idle-timeout`` in seconds, or None."""
    cells: tuple[Cell, ...]
    closes: bool


@dataclass(frozen=True)
class OneShot:
    index: int
    start: float
    gpu_seconds: float
    first_output: float
    """Seconds after its start at which it shows its first output."""
    rerun_asked: bool


def _lognormal(rng: random.Random, median: float, sigma: float, cap: float) -> float:
    return min(cap, max(1.0, median * math.exp(rng.gauss(0.0, sigma))))


def _session(rng: random.Random, index: int, start: float) -> SessionUser:
    light = rng.random() < LIGHT_SHARE
    if light:
        n, gpus, priority = rng.randint(3, 12), 1, "interactive"
        idle_ask = 600.0 if rng.random() < 0.3 else None
    else:
        n, gpus, priority = rng.randint(2, 6), rng.choice((1, 1, 2, 4)), "batch"
        idle_ask = 1800.0 if rng.random() < 0.2 else None
    cells = []
    for _ in range(n):
        if light:
            run = _lognormal(rng, 45.0, 1.0, 1200.0)
            gap = rng.uniform(1200.0, 4 * 3600.0) if rng.random() < 0.15 else _lognormal(rng, 120.0, 0.8, 3600.0)
        else:
            run = _lognormal(rng, 900.0, 1.0, 4 * 3600.0)
            gap = rng.uniform(3600.0, 14 * 3600.0) if rng.random() < 0.3 else _lognormal(rng, 300.0, 0.8, 3600.0)
        cells.append(Cell(run, gap))
    closes = rng.random() < 0.4
    cells[-1] = Cell(cells[-1].gpu_seconds, 0.0 if closes else LEFT_FOR)
    return SessionUser(index, start, light, gpus, priority, idle_ask, tuple(cells), closes)


def users(begin: float, end: float, seed: int = 27) -> tuple[list[SessionUser], list[OneShot]]:
    """The sessions and one-shot cells that start between ``begin`` and ``end`` (trace seconds)."""
    rng = random.Random(seed)
    sessions: list[SessionUser] = []
    t = begin + rng.expovariate(SESSIONS_PER_DAY / DAY)
    while t < end:
        sessions.append(_session(rng, len(sessions), t))
        t += rng.expovariate(SESSIONS_PER_DAY / DAY)
    shots: list[OneShot] = []
    t = begin + rng.expovariate(ONE_SHOTS_PER_DAY / DAY)
    while t < end:
        shots.append(OneShot(len(shots), t, _lognormal(rng, 1200.0, 1.0, 6 * 3600.0), rng.uniform(0.0, 120.0),
                             rng.random() < 0.3))
        t += rng.expovariate(ONE_SHOTS_PER_DAY / DAY)
    return sessions, shots
