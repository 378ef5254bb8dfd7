"""The ipywidgets panel: clusters to choose from, and my runs with state, a GPU plot, output and cancel.

Rows are kept by key and updated in place (a refresh sends only changed widget state). A background thread
refreshes when this kernel's tracker reports a change, or every ``interval`` seconds for what other
kernels and the cluster changed, never more often than every ``throttle`` seconds; :meth:`Panel.close`
stops it. Nothing here blocks the cell that shows the panel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape

import ipywidgets as w

from ...engine.runs.listing import RunListing, cancellable
from ...engine.runs.records import RunEntry, shown_lines
from .clusters import ClusterEntry
from .plot import sparkline

ClusterFeed = Callable[[], tuple[list[ClusterEntry], list[str]]]
"""Returns the cluster rows and notes to show (why a source is missing, how to add a cluster)."""
RunFeed = Callable[[], RunListing]


@dataclass(frozen=True)
class PanelActions:
    """What the panel's buttons do (the magic's defaults and the runs' cancel, supplied by the caller)."""

    choose: Callable[[ClusterEntry], None]
    """Make this cluster the default target of the next ``%%gpu_offload`` cells."""
    chosen: Callable[[], str]
    """The key of the current default target."""
    cancel: Callable[[RunEntry], str]
    """Stop a run as Ctrl-C would; returns what was done, in words."""


_STATE_COLOURS = {"queued": "#888", "scheduling": "#b8860b", "running": "#1f77b4", "done": "#2ca02c",
                  "failed": "#d62728"}


def _fmt_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def cluster_cells(row: ClusterEntry) -> str:
    """The row's cells as HTML (pure)."""
    gpus = "?" if row.free is None else str(row.free)
    gpus += "" if row.total is None else f" / {row.total}"
    price = "-" if row.price is None else f"{row.price:g} per GPU-hour"
    note = f' <span style="color:var(--jp-ui-font-color2, #888)">({escape(row.note)})</span>' if row.note else ""
    trust = "trusted" if row.trusted else '<span style="color:#b45309">untrusted</span>'
    # every value is escaped, numbers too: rows come from the cluster and the hub, typed or not
    return (f"<b>{escape(row.name)}</b> <code>{escape(row.key)}</code> · {escape(row.model)} · "
            f"free {escape(gpus)} GPUs · {escape(price)} · {escape(row.health)} · {trust}{note}")


def run_cells(record: RunEntry, now: float) -> str:
    """The run's summary line as HTML (pure)."""
    colour = _STATE_COLOURS.get(record.state, "inherit")
    detail = f' <span style="color:var(--jp-ui-font-color2, #888)">{escape(str(record.detail))}</span>' if record.detail else ""
    session = f" · session {escape(str(record.session))}" if record.session else ""
    # every value is escaped: a record is a file in the state directory, its fields are not checked for type
    return (f'<span class="gpu-offload-state" style="color:{colour};font-weight:bold">{escape(str(record.state))}'
            f"</span> <code>{escape(str(record.run_id)[:12])}</code> · {escape(str(record.cluster))} · "
            f"{escape(str(record.gpus))} GPU(s) · {_fmt_elapsed(record.elapsed(now))}{session} · "
            f"kernel {escape(str(record.kernel)[:8])}{detail}")


def lines_html(record: RunEntry) -> str:
    """The last lines of output (pure)."""
    text = "\n".join(shown_lines(record))
    return f'<pre style="margin:0;font-size:11px;max-height:6em;overflow:hidden">{escape(text)}</pre>'


def _close_tree(widget: w.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


class _ClusterRow:
    def __init__(self, row: ClusterEntry, on_choose: Callable[[ClusterEntry], None]) -> None:
        self.row = row
        self.button = w.Button(description="use", tooltip=f"run the next cells on {row.key}",
                               layout=w.Layout(width="90px"))
        self.cells = w.HTML()
        self.box = w.HBox([self.button, self.cells])
        self.button.on_click(lambda _: on_choose(self.row))

    def update(self, row: ClusterEntry, chosen: bool) -> None:
        self.row = row
        self.cells.value = cluster_cells(row)
        self.button.description = "✓ default" if chosen else "use"
        self.button.button_style = "success" if chosen else ""


class _RunRow:
    def __init__(self, record: RunEntry, on_cancel: Callable[[RunEntry], None]) -> None:
        self.record = record
        self.summary = w.HTML()
        self.plot = w.HTML()
        self.output = w.HTML()
        self.cancel = w.Button(description="cancel", button_style="danger", layout=w.Layout(width="80px"),
                               tooltip=f"stop run {record.run_id} as Ctrl-C would")
        self.cancel.on_click(lambda _: on_cancel(self.record))
        self.box = w.VBox([w.HBox([self.cancel, self.summary]), w.HBox([self.plot, self.output])],
                          layout=w.Layout(border="1px solid var(--jp-border-color2, #eee)", padding="2px", margin="2px 0"))

    def update(self, record: RunEntry, now: float) -> None:
        self.record = record
        self.summary.value = run_cells(record, now)
        self.plot.value = sparkline(record.util, record.mem, "", live=not record.finished)
        self.output.value = lines_html(record)
        # offered only where it can still act (a run under way, or a cluster run its dead kernel left behind)
        can = cancellable(record)
        self.cancel.disabled = not can
        self.cancel.layout.display = "" if can else "none"


class Panel:
    """The panel's widgets and the thread that keeps them current."""

    def __init__(self, clusters: ClusterFeed, runs: RunFeed, actions: PanelActions,
                 wait_change: Callable[[float], None] | None = None,
                 interval: float = 2.0, throttle: float = 0.5, max_runs: int = 20,
                 on_close: Callable[[], None] | None = None, wake: Callable[[], None] | None = None) -> None:
        self._on_close = on_close
        self._wake = wake
        self._stop = threading.Event()
        self._clusters_feed, self._runs_feed, self.actions = clusters, runs, actions
        self._wait_change: Callable[[float], object] = wait_change or self._stop.wait
        self.interval, self.throttle, self.max_runs = interval, throttle, max_runs
        self.notes = w.HTML()
        self.message = w.HTML()
        self.cluster_box = w.VBox()
        self.run_box = w.VBox()
        self._no_runs = w.HTML('<span style="color:var(--jp-ui-font-color2, #888)">no runs yet: put %%gpu_offload on a cell</span>')
        self.close_button = w.Button(description="close panel", layout=w.Layout(width="110px"))
        self.close_button.on_click(lambda _: self.close())
        self.widget = w.VBox([
            w.HBox([w.HTML("<b>GPU offload</b>"), self.close_button]),
            w.HTML("<b>Clusters</b>"), self.cluster_box, self.notes,
            w.HTML("<b>My runs</b>"), self.run_box, self.message,
        ], layout=w.Layout(border="1px solid var(--jp-border-color1, #ccc)", padding="6px"))
        self.widget.add_class("gpu-offload-panel")
        self._cluster_rows: dict[str, _ClusterRow] = {}
        self._run_rows: dict[str, _RunRow] = {}
        self._lock = threading.Lock()
        self.refreshes = 0
        self.refresh()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="gpu-offload-panel")
        self.thread.start()

    # -- refreshing ---------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the feeds once and update the widgets in place."""
        with self._lock:
            rows, notes = self._clusters_feed()
            self._show_clusters(rows, notes)
            listing = self._runs_feed()
            self._show_runs(listing)
            self.refreshes += 1

    def _show_clusters(self, rows: list[ClusterEntry], notes: list[str]) -> None:
        chosen = self.actions.chosen()
        for row in rows:
            if row.key not in self._cluster_rows:
                self._cluster_rows[row.key] = _ClusterRow(row, self._choose)
            self._cluster_rows[row.key].update(row, row.key == chosen)
        keep = [self._cluster_rows[r.key].box for r in rows]
        if list(self.cluster_box.children) != keep:
            self.cluster_box.children = keep
        self.notes.value = "".join(f'<div style="color:var(--jp-ui-font-color1, #555)">{escape(n)}</div>' for n in notes)

    def _show_runs(self, listing: RunListing) -> None:
        now = time.time()
        shown = listing.runs[: self.max_runs]
        for record in shown:
            if record.run_id not in self._run_rows:
                self._run_rows[record.run_id] = _RunRow(record, self._cancel)
            self._run_rows[record.run_id].update(record, now)
        keep = [self._run_rows[r.run_id].box for r in shown]
        if list(self.run_box.children) != keep:
            self.run_box.children = keep
        for run_id in [k for k in self._run_rows if k not in {r.run_id for r in shown}]:
            self._run_rows.pop(run_id).box.close()
        if not shown:
            self.run_box.children = [self._no_runs]
        if listing.problems:
            self.message.value = "".join(f'<div style="color:#d62728">{escape(p)}</div>' for p in listing.problems)

    def _loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wait_change(self.interval)
            pause = self.throttle - (time.monotonic() - last)
            if pause > 0 and self._stop.wait(pause):
                return
            if self._stop.is_set():
                return
            last = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - a failing source must not kill the live updates
                self.message.value = f'<div style="color:#d62728">refresh failed: {escape(str(exc))}</div>'

    # -- actions ------------------------------------------------------------------------------------------

    def _choose(self, row: ClusterEntry) -> None:
        self.actions.choose(row)
        self.message.value = (f"<div>The next <code>%%gpu_offload</code> cells run on <b>{escape(row.name)}</b> "
                              f"(<code>{escape(row.key)}</code>) unless they say --cluster or --backend.</div>")
        with self._lock:
            chosen = self.actions.chosen()
            for key, shown in self._cluster_rows.items():
                shown.update(shown.row, key == chosen)

    def _cancel(self, record: RunEntry) -> None:
        said = self.actions.cancel(record)
        self.message.value = f"<div>{escape(said)}</div>"

    def click_choose(self, key: str) -> None:
        """Choose a cluster row by key, as its button does (for scripts and tests)."""
        self._cluster_rows[key].button.click()

    def click_cancel(self, run_id: str) -> None:
        """Press a run's cancel button (for scripts and tests)."""
        self._run_rows[run_id].cancel.click()

    # -- lifetime -----------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._stop.is_set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the updates, wait for the thread, and remove the widgets."""
        self._stop.set()
        if self._wake is not None:
            self._wake()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
        if self._on_close is not None:
            self._on_close()
        _close_tree(self.widget)
        self._no_runs.close()  # not in the tree while runs are listed

    def _ipython_display_(self) -> None:
        # open_panel() has displayed the widget already; showing the returned panel again would duplicate it
        pass

    def __repr__(self) -> str:
        return f"<gpu_offload panel: {'closed' if self.closed else 'live'}; .close() stops its updates>"
