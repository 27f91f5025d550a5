"""The sweep's console progress: plain lines off a terminal, rich bars on one, and counts that add
up to the ledger's rows and say how they relate to the budget."""

import io
from types import SimpleNamespace

from spica_pipeline.progress import ProgressPrinter


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _rec(branch: str, status: str, score: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(branch=branch, status=status, score=score)


def _feed(printer: ProgressPrinter) -> None:
    """Two branches: agg searched with budget 4 (4 evaluated + 2 repeats), disagg exhaustive (3 points)."""
    printer({"event": "plan", "branch": "agg", "why": "space of 60 points > evaluation budget 4: Vizier DEFAULT",
             "exhaustive": False, "size": 60})
    printer({"event": "plan", "branch": "disagg", "why": "finite space of 3 points <= evaluation budget 4",
             "exhaustive": True, "size": 3})
    printer({"event": "branch", "branch": "agg", "exhaustive": False})
    for status, score in (("feasible", 10.0), ("cached", None), ("feasible", 30.0), ("failed", None),
                          ("cached", None), ("unsupported", None)):
        printer({"event": "trial", "record": _rec("agg", status, score)})
    printer({"event": "round", "branch": "agg", "round": 2})
    printer({"event": "branch", "branch": "disagg", "exhaustive": True})
    for score in (5.0, 7.0, 6.0):
        printer({"event": "trial", "record": _rec("disagg", "feasible", score)})
    printer({"event": "round", "branch": "disagg", "round": 1})
    printer.close()


def test_plain_lines_count_against_the_budget_and_add_up():
    out = io.StringIO()
    printer = ProgressPrinter(out, evaluation_budget=4, goal="throughput_per_gpu")
    _feed(printer)
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text  # a log or a pipe gets no control codes
    lines = text.splitlines()
    assert lines[0].startswith("branch agg: space of 60 points")
    assert lines[2].startswith("budget: 4 evaluations per searched branch (agg)")
    assert "repeated proposal is answered from the earlier result and not counted" in lines[2]
    assert any("agg: 4/4 evaluations; 2 feasible, 1 failed, 1 refused or infeasible, 2 repeats" in line
               for line in lines)
    done = next(line for line in lines if line.startswith("branch agg done"))
    assert "4 evaluations of its budget of 4" in done and "best throughput_per_gpu 30" in done
    assert any(line.startswith("branch disagg done") and "3 of 3 points of the space (exhaustive)" in line
               for line in lines)
    # 6 + 3 ledger rows: 7 evaluated + 2 repeats, so the rows exceeding the budget are explained
    assert lines[-1] == ("trials: 9 ledger rows over 2 branches = 7 evaluated + 2 repeats answered from earlier "
                         "results (budget: 4 evaluations per searched branch)")


def test_minimised_goal_shows_the_lowest_value():
    out = io.StringIO()
    printer = ProgressPrinter(out, evaluation_budget=4, goal="e2e_latency", sign=-1.0)
    printer({"event": "branch", "branch": "agg", "exhaustive": False})
    for score in (-900.0, -400.0, -700.0):  # scores are signed: higher is better
        printer({"event": "trial", "record": _rec("agg", "feasible", score)})
    printer.close()
    assert "best e2e_latency 400" in out.getvalue()


def test_time_budget_only_and_pareto_without_best():
    out = io.StringIO()
    printer = ProgressPrinter(out, evaluation_budget=None, time_budget=600.0, goal=None)
    printer({"event": "plan", "branch": "agg", "why": "continuous space: Vizier DEFAULT", "exhaustive": False,
             "size": None})
    printer({"event": "branch", "branch": "agg", "exhaustive": False})
    printer({"event": "trial", "record": _rec("agg", "feasible", 1.0)})
    printer({"event": "out_of_time", "branch": "agg", "evaluated": 1})
    printer.close()
    text = out.getvalue()
    assert "budget: the time budget (10m shared by 1 branch)" in text
    assert "branch agg done" in text and "1 evaluations (time budget)" in text
    assert "best" not in text


def test_terminal_draws_rich_bars_and_stops():
    out = _Terminal()
    printer = ProgressPrinter(out, evaluation_budget=4, goal="throughput_per_gpu")
    assert not printer.plain
    _feed(printer)
    text = out.getvalue()
    assert "━" in text  # rich's bar
    assert "4/4" in text and "3/3" in text
    assert "branch agg done" in text and text.rstrip().splitlines()[-1]  # notes print above the bars
    assert printer._progress is None  # stopped: no refresh thread left behind
    printer.close()  # idempotent


def test_dumb_terminal_gets_plain_lines(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    assert ProgressPrinter(_Terminal()).plain


def test_the_engine_log_is_named_once_before_the_first_branch():
    out = io.StringIO()
    printer = ProgressPrinter(out, evaluation_budget=4, engine_log="runs/q/logs/engine.log")
    _feed(printer)
    lines = out.getvalue().splitlines()
    named = [i for i, line in enumerate(lines) if line.endswith("runs/q/logs/engine.log")]
    assert len(named) == 1 and lines[named[0]].startswith("replay runtime output")
    assert named[0] < next(i for i, line in enumerate(lines) if line.startswith("branch agg done"))
