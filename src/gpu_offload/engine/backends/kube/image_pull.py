"""A runner pod whose image is being pulled, and how long that should take (a pure module: no I/O, no clock).

The kubelet says a pull in two events on the pod (``pkg/kubelet/images/image_manager.go``): ``Pulling`` with
``Pulling image "<image>"`` when it starts, and ``Pulled`` with ``Successfully pulled image "<image>" in <pull>
(<total> including waiting). Image size: <bytes> bytes.`` when it ends (the size clause since Kubernetes 1.30;
durations in Go's form, ``1.234s``, ``2m3.5s``, ``850ms``). An image already on the node gets one ``Pulled`` event
``Container image "<image>" already present on machine``, which says nothing of a pull's time. Liqo reflects a
donor's events on the origin's pod.

Events are untrusted text (anyone who may write events in the namespace writes them, and a donor's are
reflected): a message counts only when it matches the kubelet's format exactly, the image is compared with the
pod's own, and nothing of it is shown but what :func:`~gpu_offload.liqo_peering.untrusted_text.shown` makes fit.
The estimate is the median of the recent pulls of the same image seen in the namespace's events (Kubernetes keeps
events about an hour): pulls of one image from one registry take similar times, and the median ignores one pull
that waited behind another.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ....liqo_peering.untrusted_text import shown
from ....liqo_peering.wording import duration

PULLING, PULLED = "Pulling", "Pulled"
"""The kubelet's event reasons (``events.PullingImage``, ``events.PulledImage``)."""
MESSAGE_READ = 2048
"""A message longer than this is not the kubelet's (an image reference is at most a few hundred characters)."""
RECENT = 5
"""Only the last this many pulls of the image count."""
IMAGE_SHOWN = 200
"""Characters of an image name shown at most."""

_QUOTED = r'"((?:[^"\\]|\\.){1,1000})"'  # Go's %q of an image reference
_GO_DURATION = r"((?:\d+(?:\.\d+)?(?:h|m|s|ms|us|µs|ns))+)"
_PULLING = re.compile(rf"Pulling image {_QUOTED}")
_PULLED = re.compile(rf"Successfully pulled image {_QUOTED} in {_GO_DURATION} \({_GO_DURATION} including waiting\)"
                     r"(?:\. Image size: (\d{1,15}) bytes\.)?")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")


def go_seconds(text: str) -> float:
    """Seconds of a Go duration as ``time.Duration.String`` writes it (``1m2.5s``, ``850ms``, ``0s``)."""
    return sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))


def _unquoted(text: str) -> str:
    """The image of a Go-quoted string: only ``\\"`` and ``\\\\`` are undone (an image reference needs no other
    escape; one that has any then matches no pod's image and counts for nothing)."""
    return re.sub(r'\\(["\\])', r"\1", text)


def with_default_tag(image: str) -> str:
    """``busybox`` -> ``busybox:latest``, as the kubelet names the image it pulls (``applyDefaultImageTag``)."""
    if "@" in image or ":" in image.rsplit("/", 1)[-1]:
        return image
    return f"{image}:latest"


def same_image(a: str, b: str) -> bool:
    return with_default_tag(a) == with_default_tag(b)


@dataclass(frozen=True)
class Pulled:
    """One pull the kubelet finished: the image, its seconds (waiting behind other pulls included: what a pod
    waits) and its size in bytes when the kubelet said it."""

    image: str
    seconds: float
    size: int | None = None


def pulling_image(message: object) -> str | None:
    """The image of a ``Pulling`` event's message, or None when it is not the kubelet's form."""
    text = str(message)
    if len(text) > MESSAGE_READ:
        return None
    found = _PULLING.fullmatch(text)
    return _unquoted(found.group(1)) if found else None


def pulled(message: object) -> Pulled | None:
    """A ``Pulled`` event's message read as a finished pull, or None (an image already present, or not the
    kubelet's form)."""
    text = str(message)
    if len(text) > MESSAGE_READ:
        return None
    found = _PULLED.fullmatch(text)
    if found is None:
        return None
    size = found.group(4)
    return Pulled(_unquoted(found.group(1)), go_seconds(found.group(3)), int(size) if size is not None else None)


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
        "creationTimestamp") or "")


def pulling_now(events: Iterable[Mapping[str, Any]], uid: str, image: str) -> bool:
    """Whether the pod of ``uid`` is pulling ``image``, from its events: a ``Pulling`` of that image with no
    ``Pulled`` or failure after it."""
    mine = sorted((e for e in events if isinstance(e, Mapping) and (e.get("involvedObject") or {}).get("uid") == uid),
                  key=_when)
    state = False
    for event in mine:
        reason = event.get("reason")
        if reason == PULLING:
            found = pulling_image(event.get("message", ""))
            state = found is not None and same_image(found, image)
        elif reason in (PULLED, "Failed", "BackOff", "ErrImagePull"):
            state = False
    return state


def pulls_of(events: Iterable[Mapping[str, Any]], image: str) -> list[Pulled]:
    """The finished pulls of ``image`` among the namespace's ``Pulled`` events, oldest first."""
    found = []
    for event in sorted((e for e in events if isinstance(e, Mapping)), key=_when):
        if event.get("reason") != PULLED:
            continue
        pull = pulled(event.get("message", ""))
        if pull is not None and same_image(pull.image, image):
            found.append(pull)
    return found


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


@dataclass(frozen=True)
class PullEstimate:
    """A pull under way: the image, how long it has run as the kernel saw it, and the earlier pulls of it."""

    image: str
    elapsed: float
    earlier: tuple[Pulled, ...]

    def text(self) -> str:
        """``pulling image X for 12 s; earlier pulls of it here took about 40 s (the median of 3; 1.2 GiB): about
        28 s left``."""
        head = f"pulling image {shown(self.image, IMAGE_SHOWN)} for {duration(self.elapsed)}"
        recent = self.earlier[-RECENT:]
        if not recent:
            return (f"{head}; no earlier pull of it in this namespace to estimate from (Kubernetes keeps events about "
                    "an hour)")
        typical = statistics.median(p.seconds for p in recent)
        sizes = [p.size for p in recent if p.size is not None]
        said = f"{'the median of ' + str(len(recent)) if len(recent) > 1 else 'one pull'}"
        if sizes:
            said += f"; {_size(sizes[-1])}"
        took = f"earlier pulls of it in this namespace took about {duration(typical)} ({said})"
        longest = max(p.seconds for p in recent)
        if self.elapsed > longest:
            return f"{head}; {took}: this one is taking longer than any of them"
        left = max(typical - self.elapsed, 0.0)
        if left < 1:
            return f"{head}; {took}: it should end any moment (the slowest took {duration(longest)})"
        return f"{head}; {took}: about {duration(left)} left"


def estimate(image: str, elapsed: float, namespace_events: Sequence[Mapping[str, Any]]) -> PullEstimate:
    """The words for a pull of ``image`` that has run ``elapsed`` seconds, from the namespace's ``Pulled`` events."""
    return PullEstimate(image, elapsed, tuple(pulls_of(namespace_events, image)))
