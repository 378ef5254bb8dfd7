"""Shares of the data for ranks of different speeds, so a job across different GPUs does not wait for its slowest.

With equal shards, every step of a data-parallel job lasts as long as its slowest rank takes: the others wait
in the gradient all-reduce. Giving each rank a share proportional to its speed makes them finish together.
Speeds are the ranks' own: each times its compute (:class:`StepTimer`), and :func:`shard_sizes` exchanges the
figures through the process group, so every rank computes the same sizes from the same numbers.

The runner carries this file into every pod as the top-level module ``gpo_shards`` (stock images have no
``gpu_offload``); it imports only the standard library, and torch when it exchanges. In a cell::

    import torch.distributed as dist
    from gpo_shards import StepTimer, shard_range, shard_sizes, loss_weight

    timer = StepTimer()
    for epoch in range(epochs):
        sizes = shard_sizes(len(data), timer.seconds_per_item)   # equal until every rank has measured
        start, stop = shard_range(sizes, dist.get_rank())
        weight = loss_weight(sizes, dist.get_rank())              # DDP averages ranks as equals
        for batch in batches(data[start:stop]):
            with timer.timing(len(batch)):
                loss = loss_fn(model(batch)) * weight             # the forward: this rank's work alone
            loss.backward()                                       # DDP's all-reduce waits for the others here
            optimizer.step(); optimizer.zero_grad()

Time only what the rank does alone: a block that contains a collective (DDP's backward; its forward too when
the model has buffers and ``broadcast_buffers`` is on) lasts as long as the slowest rank takes, on every rank.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def apportion(total: int, speeds: Sequence[float]) -> list[int]:
    """``total`` items split in proportion to ``speeds`` (items per second), summing exactly to ``total``.

    Largest remainders (Hamilton's method): each rank gets the whole part of its exact share, and the items
    left go one each to the largest fractional parts, the lower rank first on a tie, so every rank that calls
    this with the same numbers gets the same answer.
    """
    if total < 0:
        raise ValueError(f"total={total}: the number of items to share must be 0 or more")
    if not speeds:
        raise ValueError("no ranks to share among: pass one speed per rank")
    if any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise ValueError(f"speeds {list(speeds)}: every rank's speed must be a positive finite number of items "
                         "per second")
    whole = sum(speeds)
    exact = [total * s / whole for s in speeds]
    sizes = [math.floor(x) for x in exact]
    left = total - sum(sizes)
    by_remainder = sorted(range(len(speeds)), key=lambda r: (-(exact[r] - sizes[r]), r))
    for r in by_remainder[:left]:
        sizes[r] += 1
    return sizes


def _gather(value: float, group: Any) -> list[float]:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("shard_sizes exchanges the ranks' speeds through torch.distributed: call "
                           "torch.distributed.init_process_group() first")
    # NCCL moves only GPU tensors; gloo and the others take CPU ones
    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl"
              else torch.device("cpu"))
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return [float(t.item()) for t in every]


def shard_sizes(total: int, seconds_per_item: float | None = None, group: Any = None) -> list[int]:
    """Every rank's share of ``total`` items, proportional to its speed; a collective: every rank calls it.

    ``seconds_per_item`` is this rank's own measure (:attr:`StepTimer.seconds_per_item`); None until it has
    one. Until every rank of ``group`` (torch.distributed's default group when None) has measured, the shares
    are equal, so the first pass can be the measurement.
    """
    mine = math.nan if seconds_per_item is None else float(seconds_per_item)
    if not math.isnan(mine) and (not math.isfinite(mine) or mine <= 0):
        raise ValueError(f"seconds_per_item={seconds_per_item}: give this rank's measured time per item (a "
                         "positive number), or None before it has measured")
    every = _gather(mine, group)
    if any(math.isnan(s) for s in every):
        return apportion(total, [1.0] * len(every))
    return apportion(total, [1.0 / s for s in every])


def shard_range(sizes: Sequence[int], rank: int) -> tuple[int, int]:
    """``(start, stop)`` of ``rank``'s items when the ranks take consecutive shares of ``sizes``."""
    if not 0 <= rank < len(sizes):
        raise ValueError(f"rank {rank}: there are {len(sizes)} ranks (0 to {len(sizes) - 1})")
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def loss_weight(sizes: Sequence[int], rank: int) -> float:
    """What to multiply ``rank``'s mean loss by so DDP's averaged gradient is the mean over all items.

    DDP averages the ranks' gradients as equals; a rank holding a larger share must count for more:
    ``sizes[rank] * world / total``, which is 1 for every rank when the shares are equal.
    """
    total = sum(sizes)
    if total == 0:
        raise ValueError("no items in any shard: nothing to weigh")
    return sizes[rank] * len(sizes) / total


class StepTimer:
    """This rank's time per item, over the steps timed since it was made (or :meth:`reset`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.items = 0

    @contextmanager
    def timing(self, items: int) -> Iterator[None]:
        """Time the block as the work on ``items`` items (wall clock: a GPU's work needs a synchronize
        before the block ends to be counted, ``torch.cuda.synchronize()``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start
            self.items += items

    def add(self, seconds: float, items: int) -> None:
        """Count ``items`` done in ``seconds`` measured elsewhere."""
        self.seconds += seconds
        self.items += items

    @property
    def seconds_per_item(self) -> float | None:
        """The measure :func:`shard_sizes` takes; None before anything was timed."""
        return self.seconds / self.items if self.items and self.seconds > 0 else None

    def reset(self) -> None:
        """Forget what was measured (after the rank's speed changed: another model, another batch size)."""
        self.seconds, self.items = 0.0, 0
