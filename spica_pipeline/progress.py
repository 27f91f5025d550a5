"""Sweep progress for people: a rich progress bar per branch on a terminal, plain lines otherwise.

The counts say how they relate to the stated budget. A branch's budget (`sweep.max_rounds` x
per-round trials) counts evaluations: replays, and proposals refused before a replay. A proposal
that repeats a point already evaluated is answered from that result ("repeat", status `cached`
in the ledger) and is not counted, so a branch's ledger rows can exceed its budget; every line
that shows counts shows both. An exhaustive branch's bar runs over its whole space instead.
"""

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

FAILED = ("failed", "timed_out")


@dataclass
class BranchCount:
    """What one branch's study has done so far."""

    name: str
    exhaustive: bool = False
    size: int | None = None  # points in the space, when finite
    statuses: Counter = field(default_factory=Counter)
    best_score: float | None = None  # the highest (signed) score
    best: float | None = None  # the same trial's value in goal units
    started: float | None = None

    @property
    def repeats(self) -> int:
        return self.statuses["cached"]

    @property
    def evaluated(self) -> int:
        return sum(self.statuses.values()) - self.repeats

    @property
    def trials(self) -> int:
        return sum(self.statuses.values())

    def total(self, budget: int | None) -> int | None:
        """The bar's end: the whole space for an exhaustive branch, else the evaluation budget."""
        return self.size if self.exhaustive else budget

    def done(self) -> int:
        """The bar's position: every point for an exhaustive branch, else counted evaluations."""
        return self.trials if self.exhaustive else self.evaluated

    def short(self, goal: str | None) -> str:
        """The bar's text: the same counts, terse."""
        failed = sum(self.statuses[s] for s in FAILED)
        text = f"{self.statuses['feasible']} feasible, {failed} failed, {self.repeats} repeats"
        if goal:
            text += ", best " + ("-" if self.best is None else f"{self.best:,.4g}")
        return text

    def detail(self, goal: str | None) -> str:
        """Feasible/failed/repeat counts and the best `goal` value (none without a goal), in plain words."""
        parts = [f"{self.statuses['feasible']} feasible"]
        failed = sum(self.statuses[s] for s in FAILED)
        if failed:
            parts.append(f"{failed} failed")
        other = self.evaluated - self.statuses["feasible"] - failed
        if other:
            parts.append(f"{other} refused or infeasible")
        if self.repeats:
            parts.append(f"{self.repeats} {'repeat' if self.repeats == 1 else 'repeats'} answered from "
                         "earlier results" + ("" if self.exhaustive else ", not counted"))
        text = ", ".join(parts)
        if goal:
            text += f"; best {goal} " + ("-" if self.best is None else f"{self.best:,.4g}")
        return text


def _plain_stream(stream: TextIO) -> bool:
    """True when `stream` is not a terminal that can redraw a bar (a pipe, a file, TERM=dumb)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return not tty or os.environ.get("TERM") == "dumb"


class ProgressPrinter:
    """Consumes `run_sweep` events.

    On a terminal: one rich progress bar per branch (evaluations against the budget, or points of
    an exhaustive space), with notes printed above the bars. Elsewhere (CI logs, pipes, tests): one
    plain line per batch of trials and per note, no control codes.

    `evaluation_budget`: trials per branch (`sweep.evaluation_budget`; None when only a time budget
    bounds the sweep). `goal`: the scalar goal's name, for the best value (None: no best shown,
    e.g. a Pareto goal); `sign`: -1 when it is minimised (record scores are signed so that higher
    is better). `terminal`: force bars (True) or plain lines (False) instead of asking the stream.
    `engine_log`: the file the replay workers write to, named once before the first branch.
    """

    def __init__(self, stream: TextIO | None = None, *, evaluation_budget: int | None = None,
                 time_budget: float | None = None, goal: str | None = None, sign: float = 1.0,
                 terminal: bool | None = None, engine_log: str | None = None):
        self.stream = stream or sys.stderr
        self.plain = _plain_stream(self.stream) if terminal is None else not terminal
        self.budget = evaluation_budget
        self.time_budget = time_budget
        self.goal = goal
        self.sign = sign
        self.engine_log = engine_log
        self.branches: dict[str, BranchCount] = {}
        self.current: str | None = None
        self.started = time.perf_counter()
        self._budget_said = False
        self._progress: Any = None  # rich.progress.Progress while bars are shown
        self._tasks: dict[str, Any] = {}
        self._closed = False

    # ---- events ----------------------------------------------------------------------------

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "trial":
            self._trial(event["record"])
        elif kind == "round":
            self._branch(event["branch"])
            if self.plain:
                self._line(self._status(event["branch"]))
        elif kind == "branch":
            self._start_branch(event["branch"], bool(event.get("exhaustive")))
        elif kind == "plan":
            count = self._branch(event["branch"])
            count.exhaustive, count.size = bool(event.get("exhaustive")), event.get("size")
            self._line(f"branch {event['branch']}: {event['why']}")
        elif kind == "resume":
            self._line(f"resuming: {event['records']} journalled results will not be recomputed")
        elif kind == "stalled":
            self._line(f"branch {event['branch']}: nothing new to evaluate after {event['rounds']} asks "
                       "(every proposal repeated an evaluated point); moving on")
        elif kind == "out_of_time":
            self._line(f"branch {event['branch']}: time budget spent after {event['evaluated']} evaluations")
        elif kind == "stopped":
            self._line(f"branch {event['branch']} stopped: {event['reason']}")
        elif kind == "warning":
            self._line(f"warning: {event['message']}")

    def _branch(self, name: str) -> BranchCount:
        if name not in self.branches:
            self.branches[name] = BranchCount(name)
        return self.branches[name]

    def _start_branch(self, name: str, exhaustive: bool) -> None:
        self._finish_branch()
        if not self._budget_said:
            self._budget_said = True
            line = self.budget_line()
            if line:
                self._line(line)
            if self.engine_log:
                self._line(f"replay runtime output (its log lines and warnings): {self.engine_log}")
        count = self._branch(name)
        count.exhaustive = exhaustive or count.exhaustive
        count.started = time.perf_counter()
        self.current = name
        if not self.plain:
            progress = self._bars()
            self._tasks[name] = progress.add_task(name, total=count.total(self.budget), detail="")

    def _trial(self, rec: Any) -> None:
        count = self._branch(rec.branch)
        count.statuses[rec.status] += 1
        if rec.status == "feasible" and rec.score is not None:  # scores are signed: higher is better
            if count.best_score is None or rec.score > count.best_score:
                count.best_score, count.best = rec.score, self.sign * rec.score
        if not self.plain and rec.branch in self._tasks:
            self._progress.update(self._tasks[rec.branch], completed=count.done(), detail=count.short(self.goal))

    def _finish_branch(self) -> None:
        """The branch's closing line: its evaluations against its budget, and why rows may exceed it."""
        name, self.current = self.current, None
        if name is None:
            return
        count = self.branches[name]
        if not self.plain and name in self._tasks:
            self._progress.update(self._tasks[name], completed=count.done(), detail=count.short(self.goal),
                                  total=count.total(self.budget) or count.done())
        self._line(self.branch_line(count))

    # ---- the lines -------------------------------------------------------------------------

    def budget_line(self) -> str | None:
        """What the budget counts, said once before the first branch runs."""
        searched = [b for b in self.branches.values() if not b.exhaustive]
        if not searched:
            return None
        modes = f"{len(self.branches)} branches" if len(self.branches) != 1 else "1 branch"
        if self.budget is None:
            spent = "" if self.time_budget is None else f" ({_duration(self.time_budget)} shared by {modes})"
            return f"budget: the time budget{spent}; a repeated proposal is answered from the earlier result"
        names = ", ".join(b.name for b in searched)
        return (f"budget: {self.budget} evaluations per searched branch ({names}); a repeated proposal is "
                "answered from the earlier result and not counted")

    def branch_line(self, count: BranchCount) -> str:
        took = "" if count.started is None else f" in {time.perf_counter() - count.started:.1f}s"
        if count.exhaustive:
            size = "" if count.size is None else f" of {count.size}"
            head = f"branch {count.name} done{took}: {count.trials}{size} points of the space (exhaustive)"
        elif self.budget is None:
            head = f"branch {count.name} done{took}: {count.evaluated} evaluations (time budget)"
        else:
            head = f"branch {count.name} done{took}: {count.evaluated} evaluations of its budget of {self.budget}"
            if count.evaluated < self.budget:
                head += " (stopped early)"
        return f"{head}; {count.detail(self.goal)}"

    def total_line(self) -> str | None:
        """The sweep's trial count, split so that it adds up to the ledger's rows."""
        counts = list(self.branches.values())
        trials = sum(c.trials for c in counts)
        if not trials:
            return None
        evaluated, repeats = sum(c.evaluated for c in counts), sum(c.repeats for c in counts)
        text = f"trials: {trials} ledger rows over {len(counts)} {'branch' if len(counts) == 1 else 'branches'}"
        if repeats:
            text += f" = {evaluated} evaluated + {repeats} repeats answered from earlier results"
        if self.budget is not None and any(not c.exhaustive for c in counts):
            text += f" (budget: {self.budget} evaluations per searched branch)"
        return text

    def _status(self, name: str) -> str:
        count = self._branch(name)
        total = count.total(self.budget)
        what = "points" if count.exhaustive else "evaluations"
        done = f"{count.done()}/{total}" if total is not None else f"{count.done()}"
        return f"[{time.perf_counter() - self.started:6.1f}s] {name}: {done} {what}; {count.detail(self.goal)}"

    # ---- output ----------------------------------------------------------------------------

    def _bars(self) -> Any:
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            console = Console(file=self.stream, force_terminal=True, highlight=False, soft_wrap=False)
            self._progress = Progress(
                TextColumn("{task.description:>7}"), BarColumn(bar_width=None, table_column=Column(min_width=10)),
                MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[detail]}", markup=False, table_column=Column(no_wrap=True)),
                console=console, expand=True, redirect_stdout=False, redirect_stderr=False, refresh_per_second=4,
            )
            self._progress.start()
        return self._progress

    def _line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the bars and print the last branch's line and the sweep's trial count (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._finish_branch()
        total = self.total_line()
        if total:
            self._line(total)
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
