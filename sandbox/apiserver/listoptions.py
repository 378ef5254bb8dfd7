"""The query parameters of a list or a watch as kube-apiserver 1.35 reads them, with the defaults it applies and
the 422 it answers for combinations it refuses (apimachinery's ``internalversion`` defaults and validation).

WatchList (``sendInitialEvents``, on by default since 1.34): a watch asking ``sendInitialEvents=true`` gets an
ADDED event for every object that matches, then, if it allows bookmarks, one BOOKMARK annotated
``k8s.io/initial-events-end: "true"`` at the resourceVersion of that state; kubectl 1.35 and client-go's
informers wait for that bookmark before they act. ``sendInitialEvents`` needs ``resourceVersionMatch=NotOlderThan``
and ``resourceVersionMatch`` needs ``sendInitialEvents``. A watch that names neither, from resourceVersion "" or
"0", is defaulted to ``sendInitialEvents=true`` (so it ends its initial events with the bookmark too, when it
allows bookmarks); one from a resourceVersion resumes after it, as before WatchList.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ApiError, Cause, bad_request, invalid

NOT_OLDER_THAN = "NotOlderThan"
EXACT = "Exact"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""The annotation of the bookmark that ends a watch's initial events (metav1.InitialEventsAnnotationKey)."""
FRESH_SECONDS = 3.0
"""How long the watch cache waits to reach a resourceVersion asked with NotOlderThan before it answers 504."""

def flag(query: Mapping[str, str], name: str) -> bool | None:
    """A boolean query parameter as apimachinery converts it: None when absent, False for "0" or "false" in any
    case, True for anything else (an empty value too)."""
    value = query.get(name)
    if value is None:
        return None
    return not (value == "0" or value.lower() == "false")


@dataclass(frozen=True)
class WatchOptions:
    """What a watch asked for, after kube-apiserver's defaults."""

    resource_version: str
    """As sent: "" or "0" (from now, or the current state with initial events), or one to resume after."""
    send_initial_events: bool | None
    """True: the current state first (ADDED events); False: only changes; None: resume after resource_version."""
    bookmarks: bool
    """allowWatchBookmarks: the end of the initial events and idle progress are sent as BOOKMARK events."""

    @property
    def since(self) -> int | None:
        """The resourceVersion to resume after, None for "" or "0"; 400 for one this server did not issue."""
        if self.resource_version in ("", "0"):
            return None
        try:
            return int(self.resource_version)
        except ValueError as exc:
            raise bad_request(f"resourceVersion={self.resource_version!r} is not a resource version this server "
                              "issued") from exc


def _forbidden(name: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", name)


def _not_supported(name: str, value: str, supported: tuple[str, ...]) -> Cause:
    listed = ", ".join(f'"{v}"' for v in supported)
    return Cause("FieldValueNotSupported", f"Unsupported value: {json.dumps(value)}: supported values: {listed}", name)


def _refused(causes: list[Cause]) -> ApiError:
    return invalid("meta.k8s.io", "ListOptions", "", tuple(causes))


def watch_options(query: Mapping[str, str]) -> WatchOptions:
    """The options of a watch request; a 422 naming each refused combination, as kube-apiserver words it."""
    rv = query.get("resourceVersion", "")
    match = query.get("resourceVersionMatch", "")
    initial = flag(query, "sendInitialEvents")
    if initial is None and not match and rv in ("", "0"):
        initial, match = True, NOT_OLDER_THAN
    causes: list[Cause] = []
    if initial is not None and match != NOT_OLDER_THAN:
        causes.append(_forbidden("resourceVersionMatch",
                                 f"sendInitialEvents requires setting resourceVersionMatch to {NOT_OLDER_THAN}"))
    if match:
        if initial is None:
            causes.append(_forbidden("resourceVersionMatch",
                                     "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
        if match != NOT_OLDER_THAN:
            causes.append(_not_supported("resourceVersionMatch", match, (NOT_OLDER_THAN,)))
        if query.get("continue"):
            causes.append(_forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"))
    if causes:
        raise _refused(causes)
    return WatchOptions(rv, initial, flag(query, "allowWatchBookmarks") is True)


def check_list(query: Mapping[str, str]) -> None:
    """A 422 for a list asking what only a watch may (sendInitialEvents) or a resourceVersionMatch without the
    resourceVersion it qualifies, as kube-apiserver answers."""
    causes: list[Cause] = []
    if match := query.get("resourceVersionMatch", ""):
        if not query.get("resourceVersion"):
            causes.append(_forbidden("resourceVersionMatch",
                                     "resourceVersionMatch is forbidden unless resourceVersion is provided"))
        if query.get("continue"):
            causes.append(_forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided"))
        if match not in (EXACT, NOT_OLDER_THAN):
            causes.append(_not_supported("resourceVersionMatch", match, (EXACT, NOT_OLDER_THAN, "")))
        if match == EXACT and query.get("resourceVersion") == "0":
            causes.append(_forbidden("resourceVersionMatch",
                                     'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'))
    if flag(query, "sendInitialEvents") is not None:
        causes.append(_forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if causes:
        raise _refused(causes)


def too_large(asked: int, current: int) -> ApiError:
    """The 504 a watch with initial events gets when the store has not reached ``asked`` within FRESH_SECONDS:
    client-go's reflector then starts again from the current state."""
    return ApiError(504, "Timeout", f"Timeout: Too large resource version: {asked}, current: {current}",
                    causes=(Cause("ResourceVersionTooLarge", "Too large resource version"),), retry_after=1)
