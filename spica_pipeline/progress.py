"""Sweep progress for people: a one-line bar on a terminal, plain log lines otherwise."""

import sys
import time
from collections import Counter
from typing import Any, TextIO


class ProgressPrinter:
    """Consumes `run_sweep` events. On a TTY it redraws one status line; elsewhere it logs
    one line per round so CI logs and pipes stay readable."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.counts: Counter = Counter()
        self.best: float | None = None
        self.branch = "-"
        self.round = 0
        self.started = time.perf_counter()
        self._dirty = False

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "trial":
            rec = event["record"]
            self.counts[rec.status] += 1
            if rec.status == "feasible" and rec.score is not None:  # scores are signed: higher is better
                if self.best is None or rec.score > self.best:
                    self.best = rec.score
            if self.tty:
                self._draw()
        elif kind == "round":
            self.branch, self.round = event["branch"], event["round"]
            if self.tty:
                self._draw()
            else:
                self._line(self._status())
        elif kind == "branch":
            self.branch, self.round = event["branch"], 0
        elif kind == "plan":
            self._line(f"branch {event['branch']}: {event['why']}")
        elif kind == "resume":
            self._line(f"resuming: {event['records']} journalled results will not be recomputed")
        elif kind == "stalled":
            self._line(f"branch {event['branch']}: no new feasible configurations after round "
                       f"{event['rounds']}; moving on")
        elif kind == "out_of_time":
            self._line(f"branch {event['branch']}: time budget spent after {event['evaluated']} trials")
        elif kind == "stopped":
            self._line(f"branch {event['branch']} stopped: {event['reason']}")
        elif kind == "warning":
            self._line(f"warning: {event['message']}")

    def _status(self) -> str:
        done = sum(self.counts.values())
        failed = done - self.counts["feasible"] - self.counts["cached"]
        best = "-" if self.best is None else f"{self.best:,.4g}"
        return (f"[{time.perf_counter() - self.started:6.1f}s] {self.branch} round {self.round}: "
                f"{done} trials, {self.counts['feasible']} feasible, {failed} failed, "
                f"{self.counts['cached']} cached, best {best}")

    def _draw(self) -> None:
        self.stream.write("\r\x1b[2K" + self._status())
        self.stream.flush()
        self._dirty = True

    def _line(self, text: str) -> None:
        if self._dirty:
            self.stream.write("\n")
            self._dirty = False
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._dirty:
            self.stream.write("\n")
            self._dirty = False
