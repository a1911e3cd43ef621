"""Progress a person can watch: one implementation for training, evaluation, decoding and sharding.

On a terminal (stderr is a tty) a :class:`Progress` is a rich bar: label, bar, percentage, ``done/total`` and the
ETA, then an optional ``info`` text (e.g. training's loss). Only the label and the info give way on a narrow
terminal: they are cut with an ellipsis, so the bar, the count and the ETA stay on an 80-column line. Bars
opened while another is live (e.g. the linear probe's passes inside ``selfsup eval all``) share one rich display,
one row each.

When stderr is not a terminal (nohup, SLURM, CI, a pipe) there is no bar: a plain line goes through
``logging.getLogger("selfsup")``, ``label done/total (pct%) ETA h:mm:ss``, at most every :data:`LOG_INTERVAL_S`
seconds, the first one only after that long, so a loop that ends sooner (an inner loop, a small folder) writes
nothing at all and no line ever says 0 %; a loop that did write lines ends with one saying how long it took.
Training chooses its own lines instead (``log_every_steps``: ``Progress(..., log_interval_s=None)`` and
``update(..., force_log=True)``). The ETA of a log line is the remaining count at the average rate since the
progress opened.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from time import monotonic
from typing import Any, TypeVar

log = logging.getLogger("selfsup")

__all__ = ["LOG_INTERVAL_S", "Progress", "format_duration", "track"]

# seconds between two log lines of a loop when stderr is not a terminal (and before the first one)
LOG_INTERVAL_S = 30.0
_BAR_WIDTH = 20

T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """``h:mm:ss``, as rich's ETA column writes it."""
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}"


def _stderr_console() -> Any:
    """The rich console bars draw on by default: stderr, when it is a terminal; None when it is not."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


class _Shared:
    """The one live rich display of the default console, shared by the bars open at the same time."""

    display: Any = None
    users = 0


def _columns() -> list[Any]:
    """Label, bar, percentage, done/total, ETA, info. On a narrow terminal only the label and the info give way (cut
    with an ellipsis, the longer first): the bar, the percentage, the count and the ETA keep their widths."""
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TaskProgressColumn
    from rich.table import Column
    from rich.text import Text

    class Eta(ProgressColumn):
        """``ETA h:mm:ss`` while running (``ETA -:--:--`` before a rate is known), ``in h:mm:ss`` when done."""

        def render(self, task: Any) -> Text:
            if task.finished and task.finished_time is not None:
                return Text(f"in {format_duration(task.finished_time)}", style="progress.elapsed")
            left = task.time_remaining
            return Text(f"ETA {format_duration(left) if left is not None else '-:--:--'}", style="progress.remaining")

    class Shrinking(ProgressColumn):
        """One line of text (the task's description, or its ``info`` field), cut with an ellipsis to the width the
        other columns leave: rich shrinks a column that may wrap, and the text itself never wraps."""

        def __init__(self, field: str | None, style: str) -> None:
            self.field, self.style = field, style
            super().__init__(table_column=Column(no_wrap=False))

        def render(self, task: Any) -> Text:
            text = task.description if self.field is None else task.fields.get(self.field, "")
            return Text(text, no_wrap=True, overflow="ellipsis", style=self.style)

    def fixed() -> Column:
        return Column(no_wrap=True)

    return [Shrinking(None, "bold"), BarColumn(bar_width=_BAR_WIDTH, table_column=fixed()),
            TaskProgressColumn(table_column=fixed()), MofNCompleteColumn(table_column=fixed()),
            Eta(table_column=fixed()), Shrinking("info", "progress.description")]


class Progress:
    """A bar on a terminal, log lines otherwise (see the module docstring), for ``total`` units of work.

    ``enabled=False``: nothing at all. ``bar=False``: never a bar, log lines even on a terminal (training with
    ``trainer.progress=false``). ``start``: units already done (a resumed run); the ETA counts from there.
    ``leave=False``: the bar's row disappears when it closes (inner loops). ``log_interval_s=None``: no timed log
    lines; the caller asks for each one (``update(..., force_log=True)``). ``console``: a rich console to draw on
    (tests); a bar is drawn when it is a terminal.
    """

    def __init__(self, label: str, total: int | None, *, unit: str = "", start: int = 0, enabled: bool = True,
                 bar: bool = True, leave: bool = True, log_interval_s: float | None = LOG_INTERVAL_S,
                 console: Any = None) -> None:
        self.label, self.total, self.unit, self.leave = label, total, unit, leave
        self.completed = self.start = start
        self.enabled, self.log_interval_s = enabled, log_interval_s
        self.began = self.last_log = monotonic()
        self.logged = 0
        self.display, self.task, self._shared = None, None, False
        if enabled and bar:
            shared = console is None
            console = _stderr_console() if shared else console
            if console is not None and console.is_terminal:
                self._open_bar(console, shared)

    def _open_bar(self, console: Any, shared: bool) -> None:
        from rich.progress import Progress as RichProgress

        if shared:  # the default console (stderr): one live display for every open bar
            if _Shared.display is None:
                _Shared.display = RichProgress(*_columns(), console=console)
                _Shared.display.start()
            _Shared.users += 1
            self.display, self._shared = _Shared.display, True
        else:
            self.display = RichProgress(*_columns(), console=console)
            self.display.start()
        self.task = self.display.add_task(self.label, total=self.total, completed=self.start, info="")
        self.display.refresh()  # drawn at once, not at the next tick: a short loop's bar shows too

    def advance(self, n: int = 1, info: str | None = None) -> None:
        """``n`` more units done."""
        self.update(self.completed + n, info)

    def update(self, completed: int, info: str | None = None, force_log: bool = False) -> None:
        """``completed`` units done so far; ``info`` shown beside the bar or after the log line's numbers;
        ``force_log``: write a log line now (when there is no bar)."""
        self.completed = completed
        if not self.enabled:
            return
        if self.display is not None:
            fields = {} if info is None else {"info": info}
            self.display.update(self.task, completed=completed, **fields)
            return
        now = monotonic()
        timed = self.log_interval_s is not None and now - self.last_log >= self.log_interval_s
        if force_log or (timed and completed > self.start):  # a timed line says something done: never a 0 % line
            log.info(self.line(now, info))
            self.last_log, self.logged = now, self.logged + 1

    def line(self, now: float, info: str | None = None) -> str:
        """``label done/total (pct%) ETA h:mm:ss | info``: the log line at time ``now`` (``time.monotonic``)."""
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            text = f"{self.label} {self.completed}{unit} in {format_duration(now - self.began)}"
        else:
            done = self.completed - self.start
            eta = format_duration((self.total - self.completed) * (now - self.began) / done) if done > 0 else "?"
            text = f"{self.label} {self.completed}/{self.total}{unit} ({100 * self.completed / self.total:.0f}%) " \
                   f"ETA {eta}"
        return text + (f" | {info}" if info else "")

    def close(self) -> None:
        """The bar ends (its row stays unless ``leave=False``); a loop that wrote log lines writes its last one."""
        if self.display is not None:
            self._end_bar()
        elif self.enabled and self.logged and self.log_interval_s is not None:
            unit = f" {self.unit}" if self.unit else ""
            log.info("%s %d%s done in %s", self.label, self.completed, unit,
                     format_duration(monotonic() - self.began))
            self.logged = 0
        self.enabled = False

    def _end_bar(self) -> None:
        if not self.leave:
            self.display.remove_task(self.task)
        if not self._shared:
            self.display.stop()
        else:
            _Shared.users -= 1
            if _Shared.users == 0:
                _Shared.display.stop()
                _Shared.display = None
        self.display = None

    def __del__(self) -> None:
        """A bar left open (its loop raised before ``close``) ends when it is dropped: no display stays live."""
        if getattr(self, "display", None) is not None:
            self._end_bar()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


def track(items: Iterable[T], label: str, total: int | None = None, **kwargs: Any) -> Iterator[T]:
    """``items``, one :class:`Progress` unit each (``total`` defaults to ``len(items)``); keyword arguments as
    :class:`Progress`. The bar closes when the loop ends, breaks or raises."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(label, total, **kwargs) as progress:
        for item in items:
            yield item
            progress.advance()
