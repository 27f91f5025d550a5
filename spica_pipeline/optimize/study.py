"""The per-branch study loop (ask, triage, evaluate, tell), with exhaustive mode, dedup and resume.

A branch study is a deterministic function of (branch space, seed, evaluation results): the same
inputs produce the same trials in the same order. Two calls are expensive or non-deterministic,
the optimizer's suggest and the replay, and both go through a `Journal` that memoises them. Resuming
an interrupted sweep is therefore just running the loop again with the old journal: completed
suggestions and evaluations are read back instead of recomputed, and the ledger comes out equal to
an uninterrupted run's.

No Dagster and no I/O here: the caller supplies the sampler, the candidate builder, the wave
evaluator, the scorer and the journal.
"""

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from spica_pipeline.errors import one_line
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest
from spica_pipeline.jsonvalue import json_safe, spec_hash
from spica_pipeline.optimize import cost
from spica_pipeline.optimize.ledger import TrialRecord
from spica_pipeline.optimize.neighbourhood import NEIGHBOURHOOD
from spica_pipeline.optimize.trial import (
    Backend,
    BranchOutcome,
    HistoryItem,
    Journal,
    KnownPoint,
    MemoryJournal,
    Proposal,
    Sampler,
    Scored,
    StudySettings,
    TrialCounter,
    point_key,
)
from spica_pipeline.space.shapes import ParallelConfig

ATTEMPT_FACTOR = 11  # a round asks for its batch plus up to 10x replacements for failed or repeated trials
# Charge an ask its predicted model seconds whenever the model ran (the sampler says so,
# `last_model_ran`; journalled with the ask, so a resume charges the same), whoever answered its
# trials: a model batch whose every suggestion was a look-alike replaced by the neighbourhood
# designer ran the GP too, and leaving it uncharged lets the optimizer's share of wall time run over
# `sweep.optimizer_share`. False, or a sampler or journal entry that does not say: judged from the
# recorded designers (`_model_answered`).
CHARGE_MODEL_RAN = True


def run_branch_study(
    branch: str,
    sampler: Sampler,
    build: Callable[[dict[str, Any], ParallelConfig], EvalRequest],
    evaluate_wave: Callable[[list[EvalRequest]], list[EvalOutcome]] | None,
    score: Callable[[EvalOutcome], Scored],
    settings: StudySettings,
    *,
    journal: Journal | None = None,
    counter: TrialCounter | None = None,
    warm_history: Iterable[HistoryItem] = (),
    exhaustive_points: Iterable[Proposal] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_round: Callable[[BranchOutcome], None] | None = None,
    backend: Backend | None = None,
) -> BranchOutcome:
    """Run one branch: Vizier suggestions, or every point of `exhaustive_points` when given.

    With a `backend`, dispatch is asynchronous (`_AsyncDriver`: a free worker gets the next
    suggestion at once); with only `evaluate_wave`, rounds of waves (the barrier path)."""
    loop = _BranchLoop(branch, sampler, build, evaluate_wave, score, settings,
                       journal or MemoryJournal(), counter or TrialCounter(), on_record)
    loop.history.extend(warm_history)
    if exhaustive_points is not None:
        loop.result.mode = "exhaustive"
    if backend is not None:
        _AsyncDriver(loop, backend, exhaustive_points).run(on_round)
    elif exhaustive_points is not None:
        loop.run_exhaustive(iter(exhaustive_points), on_round)
    else:
        loop.run_rounds(on_round)
    return loop.result


class _BranchLoop:
    def __init__(self, branch, sampler, build, evaluate_wave, score, settings, journal, counter, on_record):
        self.branch = branch
        self.sampler = sampler
        self.build = build
        self.evaluate_wave = evaluate_wave
        self.score = score
        self.settings = settings
        self.journal = journal
        self.counter = counter
        self.on_record = on_record
        self.history: list[HistoryItem] = []
        self.result = BranchOutcome(branch=branch)
        # spec_hash -> the record that first produced it in this run (the dedup cache)
        self.seen: dict[str | None, TrialRecord] = {}
        self.taken: set[tuple[str, ParallelConfig]] = set()  # point keys already proposed in this branch
        self._first_failures: list[str] = []
        self._breaker_done = False
        self.designers: list[str] = []  # who proposed each trial of the batch in progress (in order)
        self.replay_estimates: dict[int, float] = {}  # trial -> predicted replay seconds (cost-aware fill)

    # -- the two drivers ---------------------------------------------------------------------

    def run_rounds(self, on_round) -> None:
        per_round = self.settings.per_round
        cap = ATTEMPT_FACTOR * per_round
        rounds = itertools.count(1) if self.settings.max_rounds is None else range(1, self.settings.max_rounds + 1)
        for round_no in rounds:
            if self.result.stopped or self._out_of_time():
                break
            unique = attempts = 0
            asks = 0
            while unique < per_round and attempts < cap and not self._out_of_time():
                count = min(per_round - unique, cap - attempts)
                parameters, seconds = self._suggest(round_no, asks, count)
                asks += 1
                if not parameters:
                    break
                attempts += len(parameters)
                proposals = []
                for p in parameters:
                    proposal = self.sampler.propose(p, self.taken)
                    self.taken.add(point_key(proposal.selection, proposal.parallel_config))
                    proposals.append(proposal)
                share = seconds / len(proposals)
                unique += self._run_batch(round_no, "vizier", proposals, share)
            self.result.rounds = round_no
            if on_round:
                on_round(self.result)
            if self.result.stopped or self.result.out_of_time:
                break
            if unique < per_round:
                self.result.stalled = True
                break

    def run_exhaustive(self, points, on_round) -> None:
        per_round = max(1, self.settings.per_round)
        round_no = 0
        while not self._out_of_time():
            batch = [p for _, p in zip(range(per_round), points)]
            if not batch:
                break
            round_no += 1
            self._run_batch(round_no, "exhaustive", batch, 0.0)
            self.result.rounds = round_no
            if on_round:
                on_round(self.result)

    def _out_of_time(self) -> bool:
        if self.settings.out_of_time():
            self.result.out_of_time = True
        return self.result.out_of_time

    # -- one ask batch -----------------------------------------------------------------------

    def _suggest(self, round_no: int, ask_no: int, count: int) -> tuple[list[dict[str, Any]], float]:
        """Ask the optimizer, or read the answer back from the journal on resume."""
        key = spec_hash(json_safe({
            "branch": self.branch, "round": round_no, "ask": ask_no, "count": count,
            "history": [[h.parameters, h.metrics, h.infeasible_reason] for h in self.history],
        }))
        suggestions, seconds, designers, _ = self._ask(key, count, list(self.history), [], False)
        self.designers = designers
        return suggestions, seconds

    def _ask(self, key: str, count: int, history: list[HistoryItem], pending: list[dict[str, Any]],
             cheap: bool, local: Callable[[int], tuple[list[dict[str, Any]], str]] | None = None,
             ) -> tuple[list[dict[str, Any]], float, list[str], bool | None]:
        """(suggestions, seconds, designer of each, whether a model-based designer ran: None when
        unknown): journalled under `key`, so a resume reads back the very answer (and designers)
        the interrupted run got. `local(count)`, when given, answers first (the cost-aware fill's
        neighbourhood designer); the sampler fills the rest, told the local proposals as pending."""
        cached = self.journal.get_suggestions(key)
        if cached is not None:
            if cached and not all({"designer", "parameters"} <= set(e) for e in cached):
                return [dict(e) for e in cached], 0.0, [""] * len(cached), None  # written before designers were recorded
            flags = {e.get("model_ran") for e in cached}
            recorded = flags.pop() if len(flags) == 1 else None  # written before it was recorded: None
            return [e["parameters"] for e in cached], 0.0, [e["designer"] for e in cached], recorded
        start = time.perf_counter()
        suggestions: list[dict[str, Any]] = []
        designers: list[str] = []
        model_ran: bool | None = False
        if local is not None:
            near, name = local(count)
            suggestions, designers = [dict(p) for p in near[:count]], [name] * min(count, len(near))
        rest = count - len(suggestions)
        if rest > 0:
            ask = getattr(self.sampler, "suggest_pending", None)
            named: str | list[str]
            if ask is not None:  # one designer for the batch, or one per suggestion
                more, named = ask(rest, history, pending + suggestions, cheap)
                said = getattr(self.sampler, "last_model_ran", None)
                model_ran = None if said is None else bool(said)
            else:
                more, named = self.sampler.suggest(rest, history), getattr(self.sampler, "designer", "sampler")
                model_ran = None
            if isinstance(named, str):
                named = [named] * len(more)
            elif len(named) != len(more):
                raise ValueError(f"the sampler named {len(named)} designers for {len(more)} suggestions")
            suggestions += [dict(p) for p in more]
            designers += list(named)
        seconds = time.perf_counter() - start
        entries: list[dict[str, Any]] = [{"designer": d, "parameters": p} for d, p in zip(designers, suggestions)]
        if model_ran is not None:
            for e in entries:
                e["model_ran"] = model_ran
        self.journal.put_suggestions(key, entries, seconds)
        self.result.optimizer_seconds += seconds
        return suggestions, seconds, designers, model_ran

    def _new_record(self, round_no: int, source: str, proposal: Proposal, opt_share: float,
                    designer: str) -> tuple[TrialRecord, EvalRequest | None]:
        """A numbered trial record, plus its request when it needs one (None: already decided:
        unsupported, or the candidate build failed)."""
        rec = TrialRecord(
            branch=self.branch, trial=self.counter.next(), round=round_no, source=source,
            status="pending", reason=None, spec_hash=None, parameters=proposal.parameters,
            selection=proposal.selection, parallel_config=proposal.parallel_config.to_dict(),
            used_gpus=proposal.parallel_config.used_gpus, projection=proposal.projection,
            optimizer_seconds=opt_share, designer=designer,
        )
        if not proposal.supported:
            self._finish(rec, "unsupported", proposal.unsupported_reason
                         or f"backend '{proposal.selection.get('backend')}' does not support this "
                            "parallel config")
            return rec, None
        try:
            request = self.build(proposal.selection, proposal.parallel_config)
        except Exception as exc:  # a bad candidate never aborts the sweep
            self._finish(rec, "failed", f"candidate build failed: {type(exc).__name__}: {one_line(exc)[:500]}")
            return rec, None
        rec.spec_hash = request.spec_hash
        rec.config = request.candidate.to_dict()
        return rec, request

    def _run_batch(self, round_no: int, source: str, proposals: list[Proposal], opt_share: float) -> int:
        """Triage, evaluate and record one batch; returns the number of trials it counted against
        the budget (every trial except cache hits and in-batch duplicates)."""
        records: list[TrialRecord] = []
        primaries: dict[str | None, int] = {}  # spec_hash -> index of its first record in this batch
        todo: list[tuple[int, EvalRequest]] = []
        duplicates: list[tuple[int, int]] = []  # (record index, primary index)
        for index, proposal in enumerate(proposals):
            designer = "exhaustive" if source == "exhaustive" else (
                self.designers[index] if index < len(self.designers) else "")
            rec, request = self._new_record(round_no, source, proposal, opt_share, designer)
            records.append(rec)
            if request is None:
                continue
            earlier = self.seen.get(rec.spec_hash)
            if earlier is not None:
                self._copy_cached(rec, earlier)
            elif rec.spec_hash in primaries:
                duplicates.append((len(records) - 1, primaries[rec.spec_hash]))
            else:
                primaries[rec.spec_hash] = len(records) - 1
                todo.append((len(records) - 1, request))

        self._evaluate(records, todo)
        for index, primary in duplicates:
            self._copy_cached(records[index], records[primary])
        counted = 0
        for rec in records:
            counted += self._commit(rec)
        return counted

    def _commit(self, rec: TrialRecord) -> int:
        """Count (unless it reused an earlier outcome), feed the breaker, emit; returns 1 if counted."""
        counted = rec.status != "cached"
        if counted:
            self.result.evaluated += 1
            self._breaker(rec)
        self._emit(rec)
        return int(counted)

    def _breaker(self, rec: TrialRecord) -> None:
        """Circuit breaker: the first N counted trials of the branch all failed the same way."""
        n = self.settings.failure_breaker
        if n <= 0 or self.result.stopped or self._breaker_done:
            return
        if rec.status not in ("failed", "timed_out"):
            self._breaker_done = True  # something worked (or was merely infeasible): never trip
            return
        self._first_failures.append(_reason_class(rec.reason or rec.status))
        if len(self._first_failures) >= n:
            self._breaker_done = True
            if len(set(self._first_failures)) == 1:
                self.result.stopped = (f"circuit breaker: the first {n} candidates all failed for the same "
                                       f"reason: {rec.reason or rec.status}")

    def _from_journal(self, rec: TrialRecord) -> bool:
        """Resolve `rec` from the journal if its spec was evaluated before (True if so)."""
        journalled = self.journal.get_outcome(rec.spec_hash)
        if journalled is None:
            return False
        trial, outcome = journalled
        self._apply(rec, outcome)
        if trial != rec.trial:  # an earlier sweep in this directory already replayed this exact spec
            rec.status, rec.reason = "cached", _cached_reason(outcome.status, trial)
            rec.replay_seconds = 0.0
        # else: resume, the very same trial finished before the interruption
        self.seen[rec.spec_hash] = rec
        return True

    def _record_outcome(self, rec: TrialRecord, outcome: EvalOutcome) -> None:
        # every outcome, time-outs and failures included: a resume never pays for it again
        self.journal.put_outcome(rec.trial, rec.spec_hash, outcome)
        self.result.replay_seconds += outcome.replay_seconds
        self._apply(rec, outcome)
        self.seen[rec.spec_hash] = rec

    def _evaluate(self, records: list[TrialRecord], todo: list[tuple[int, EvalRequest]]) -> None:
        pending: list[tuple[int, EvalRequest]] = []
        for index, request in todo:
            if not self._from_journal(records[index]):
                pending.append((index, request))
        wave_size = max(1, self.settings.workers)
        for start in range(0, len(pending), wave_size):
            wave = pending[start:start + wave_size]
            outcomes = self.evaluate_wave([request for _, request in wave])
            for (index, _), outcome in zip(wave, outcomes):
                self._record_outcome(records[index], outcome)

    def _apply(self, rec: TrialRecord, outcome: EvalOutcome) -> int:
        rec.replay_seconds = outcome.replay_seconds
        self.replay_estimates[rec.trial] = cost.outcome_replay_seconds(
            outcome.report, outcome.derived, outcome.repeats, self.settings.replay_estimate_s)
        rec.report = outcome.report
        rec.spread = outcome.spread or {}
        if outcome.derived:
            rec.config = {**rec.config, **outcome.derived}
        if outcome.status != "feasible":
            self._finish(rec, outcome.status, outcome.reason or outcome.status)
            return 0
        scored = self.score(outcome)
        rec.score, rec.objectives = scored.score, scored.objectives
        if scored.told_metrics is None:
            self._finish(rec, "infeasible", scored.reason or "no usable objective in the replay report")
            return 0
        rec.told_metrics = scored.told_metrics
        self._finish(rec, "feasible", None)
        return 1

    def _copy_cached(self, rec: TrialRecord, earlier: TrialRecord) -> None:
        rec.report, rec.spread = earlier.report, earlier.spread
        rec.config = earlier.config
        rec.score, rec.objectives, rec.told_metrics = earlier.score, earlier.objectives, earlier.told_metrics
        rec.replay_seconds = 0.0
        rec.status, rec.reason = "cached", _cached_reason(earlier.status, earlier.trial, earlier.reason)

    def _finish(self, rec: TrialRecord, status: str, reason: str | None) -> None:
        rec.status, rec.reason = status, reason

    def _emit(self, rec: TrialRecord) -> None:
        told_ok = rec.told_metrics is not None  # set only for feasible results (and their cache hits)
        self.history.append(HistoryItem(
            parameters=rec.parameters,
            metrics=rec.told_metrics if told_ok else None,
            infeasible_reason=None if told_ok else (rec.reason or rec.status),
        ))
        self.result.records.append(rec)
        self.result.counts[rec.status] += 1
        if self.on_record:
            self.on_record(rec)


@dataclass
class _Slot:
    """One trial of the asynchronous driver, in trial order."""

    rec: TrialRecord
    config: ParallelConfig | None = None  # the parallel config it evaluates (None: an unsupported proposal)
    done: bool = False
    primary: int | None = None  # index of the slot whose outcome this duplicate copies


class _AsyncDriver:
    """No idle workers: when a worker frees up, the next suggestion goes out.

    Determinism without barriers: suggestion k (k-th trial of the branch) is asked with exactly
    the trials before k - lag as history and the trials in [k - lag, k) as pending, whatever has
    actually finished. The ask waits only when a trial older than that window is still running.
    So the suggestions, hence the ledger, depend on the seed and the outcomes, never on timing;
    the journal memoises each ask by (position, count, history, pending), so a resume is exact.
    Records are emitted in trial order as soon as every earlier trial is resolved.

    Cost-aware asks: while model-based suggest time would exceed `optimizer_share` of the branch's
    wall time, asks are filled from the sampler's cheap designers: its local (neighbourhood)
    designer first when it has one (`suggest_local`, told only the trials the ask's history holds),
    then quasi-random for the rest of the batch. By default ("predicted") both
    times are predictions (optimize/cost.py) from positions, history sizes and a fixed per-trial
    replay estimate, never from a clock, so the choice is a function of the seed and the outcomes;
    "measured" compares measured seconds instead. The choice is recorded on each trial
    (`designer`) and in the journal, so a resume repeats it exactly.
    """

    def __init__(self, loop: "_BranchLoop", backend: Backend, points: Iterable[Proposal] | None):
        self.loop = loop
        self.backend = backend
        self.points = None if points is None else iter(points)
        st = loop.settings
        self.workers = max(1, min(int(getattr(backend, "workers", st.workers) or 1), st.workers or 1))
        self.lag = st.lag if st.lag is not None else 2 * self.workers
        # an exhaustive branch covers its whole space (the plan chose it because it fits)
        self.budget = None if (st.max_rounds is None or points is not None) else st.max_rounds * st.per_round
        self.slots: list[_Slot] = []
        self.inflight: dict[int, int] = {}  # ticket -> slot index
        self.waiting_dups: dict[int, list[int]] = {}  # primary slot -> duplicate slots
        self.committed = 0
        self.reported = 0  # committed trials already handed to on_round
        self.counted = 0  # trials dispatched that count against the budget
        self.free_streak = 0  # consecutive proposals that reused an earlier outcome
        self.queue: list[tuple[dict[str, Any] | Proposal, str, float]] = []
        self.asks = 0
        self.model_seconds = 0.0  # measured seconds of fresh model-based asks ("measured")
        self.predicted_model_s = 0.0  # predicted seconds of every model-based ask so far ("predicted")
        self.started = st.clock()

    # -- main loop ---------------------------------------------------------------------------

    def run(self, on_round) -> None:
        loop, st = self.loop, self.loop.settings
        cap = (ATTEMPT_FACTOR - 1) * max(1, st.per_round)
        try:
            while not loop.result.stopped and not loop._out_of_time():
                if self.budget is not None and self.counted >= self.budget:
                    break
                if self.free_streak >= cap:
                    loop.result.stalled = True
                    break
                if not self.queue and not self._refill(on_round):
                    break
                item, designer, share = self.queue.pop(0)
                self._dispatch(item, designer, share)
                self._commit_ready(on_round)
            self._drain(on_round)
        finally:
            loop.result.rounds = self.asks

    def _refill(self, on_round) -> bool:
        """Queue the next batch of proposals; False when there is nothing more to propose."""
        loop, st = self.loop, self.loop.settings
        count = max(1, st.per_round)
        if self.budget is not None:
            count = min(count, self.budget - self.counted)
        if self.points is not None:
            batch = [p for _, p in zip(range(count), self.points)]
            self.queue = [(p, "exhaustive", 0.0) for p in batch]
            self.asks += bool(batch)
            return bool(batch)
        k = len(self.slots)
        need = max(0, k - self.lag)
        while any(not self.slots[i].done for i in range(need)):
            if not self.inflight:  # an unresolved trial with nothing running: a driver bug
                raise RuntimeError(f"branch {loop.branch}: trial slot unresolved with no evaluation in flight")
            self._collect(block=True)
        self._commit_ready(on_round)  # every slot before `need` is done, so committed >= need
        # loop.history = warm history + committed trials in order; keep those before `need`
        history = list(loop.history[:len(loop.history) - (self.committed - need)])
        pending = [self.slots[i].rec.parameters for i in range(need, k)]
        ask_s = cost.predicted_ask_seconds(len(history) + len(pending), count, st.objectives)
        cheap = self._cheap(need, k + count, ask_s)
        key = spec_hash(json_safe({
            "v": 2, "branch": loop.branch, "position": k, "count": count,
            "history": [[h.parameters, h.metrics, h.infeasible_reason] for h in history],
            "pending": pending,
        }))
        local = self._local(need) if cheap else None
        t0 = st.clock()
        suggestions, seconds, designers, model_ran = loop._ask(key, count, history, pending, cheap, local)
        charged = model_ran if CHARGE_MODEL_RAN and model_ran is not None else _model_answered(designers)
        if not cheap and charged:
            self.predicted_model_s += ask_s  # journal hit or not: the prediction is the same
            if seconds:  # a fresh model-based ask (not a journal hit)
                self.model_seconds += st.clock() - t0
        if not suggestions:
            return False
        self.asks += 1
        share = seconds / len(suggestions)
        self.queue = [(p, d, share) for p, d in zip(suggestions, designers)]
        return True

    def _local(self, known: int) -> Callable[[int], tuple[list[dict[str, Any]], str]] | None:
        """The cost-aware fill's local designer, when the sampler has one (`suggest_local`): it
        learns from the first `known` trials (those the ask's history holds: never a trial that
        merely happened to finish early, so the answer does not depend on timing) and avoids
        every point already proposed (history and pending)."""
        ask = getattr(self.loop.sampler, "suggest_local", None)
        if ask is None:
            return None
        points: list[KnownPoint] = []
        pending: list[tuple[dict[str, Any], ParallelConfig]] = []
        for index, slot in enumerate(self.slots):
            if slot.config is None or slot.rec.selection is None:
                continue
            if index < known:
                points.append((slot.rec.selection, slot.config, slot.rec.told_metrics))
            else:
                pending.append((slot.rec.selection, slot.config))
        taken = frozenset(self.loop.taken)
        return lambda count: ask(count, points, pending, taken)

    def _cheap(self, known: int, trials_after: int, ask_s: float) -> bool:
        """Whether the next ask goes to the cheap designer (see the class docstring). "predicted":
        the replays of the first `known` trials (all finished) are predicted from their outcomes,
        the rest up to `trials_after` at those trials' mean (or the a-priori estimate)."""
        st = self.loop.settings
        if st.optimizer_share is None or st.cost_aware == "off":
            return False
        if st.cost_aware == "measured":
            return self.model_seconds > 0 and self.model_seconds > st.optimizer_share * (st.clock() - self.started)
        estimates = self.loop.replay_estimates
        done = [estimates.get(self.slots[i].rec.trial, 0.0) for i in range(known)]  # 0: no replay (cache hit...)
        replayed = [e for e in done if e > 0]
        per_trial = sum(replayed) / len(replayed) if replayed else st.replay_estimate_s
        replays = sum(done) + (trials_after - known) * per_trial
        return not cost.model_ask_fits(self.predicted_model_s, ask_s, replays, self.workers, st.optimizer_share)

    # -- one trial -----------------------------------------------------------------------------

    def _dispatch(self, item, designer: str, share: float) -> None:
        loop = self.loop
        if isinstance(item, Proposal):
            proposal, source = item, "exhaustive"
        else:
            proposal, source = loop.sampler.propose(item, loop.taken), "vizier"
            loop.taken.add(point_key(proposal.selection, proposal.parallel_config))
        rec, request = loop._new_record(self.asks, source, proposal, share, designer)
        index = len(self.slots)
        slot = _Slot(rec, proposal.parallel_config if proposal.supported else None)
        self.slots.append(slot)
        if request is None:  # unsupported or build failure: decided, and counted
            slot.done = True
            self._count()
            return
        earlier = loop.seen.get(rec.spec_hash)
        if earlier is not None:
            loop._copy_cached(rec, earlier)
            slot.done = True
            self.free_streak += 1
            return
        primary = self._inflight_primary(rec.spec_hash)
        if primary is not None:
            slot.primary = primary
            self.waiting_dups.setdefault(primary, []).append(index)
            self.free_streak += 1
            return
        if loop._from_journal(rec):
            slot.done = True
            if rec.status != "cached":
                self._count()
            else:
                self.free_streak += 1
            return
        while len(self.inflight) >= self.workers:
            self._collect(block=True)
        self.inflight[self.backend.submit(request)] = index
        self._count()

    def _count(self) -> None:
        self.counted += 1
        self.free_streak = 0

    def _inflight_primary(self, spec: str | None) -> int | None:
        for index in self.inflight.values():
            if self.slots[index].rec.spec_hash == spec:
                return index
        return None

    def _collect(self, block: bool) -> None:
        if not self.inflight:
            return
        for completion in self.backend.wait(None if block else 0):
            index = self.inflight.pop(completion.ticket, None)
            if index is None:
                continue
            slot = self.slots[index]
            self.loop._record_outcome(slot.rec, completion.outcome)
            slot.done = True
            for dup in self.waiting_dups.pop(index, []):
                self.loop._copy_cached(self.slots[dup].rec, slot.rec)
                self.slots[dup].done = True

    def _commit_ready(self, on_round) -> None:
        """Emit resolved trials in trial order (the ledger never depends on completion order)."""
        self._collect(block=False)
        while self.committed < len(self.slots) and self.slots[self.committed].done:
            self.loop._commit(self.slots[self.committed].rec)
            self.committed += 1
        # the anytime result: after every `per_round` newly committed trials
        if on_round and self.committed - self.reported >= max(1, self.loop.settings.per_round):
            self._report(on_round)

    def _report(self, on_round) -> None:
        self.reported = self.committed
        self.loop.result.rounds = self.asks
        on_round(self.loop.result)

    def _drain(self, on_round) -> None:
        while self.inflight:
            self._collect(block=True)
        self._commit_ready(None)
        if on_round and self.committed > self.reported:
            self._report(on_round)


_CHEAP_DESIGNERS = ("QUASI_RANDOM_SEARCH", "RANDOM_SEARCH", "sampler", "exhaustive")


def _model_answered(designers: Sequence[str]) -> bool:
    """Whether a model-based designer answered any trial of an ask: the ask is then charged its
    predicted model seconds. The cost-aware fill's neighbourhood designer is cheap wherever it
    answers: a model's quasi-random seed batch handed to it (neighbourhood.SEED_BATCH_TO_LOCAL)
    ran no model, so it is not charged as a model ask. A judgement from the recorded designers
    only, so a resume charges the same; its blind spot: a model batch whose every suggestion was a
    look-alike replaced by the neighbourhood designer is not charged either, although the model ran
    and its time counts against the optimizer share. So it is the fallback only, for a sampler or
    journal that does not say whether the model ran (CHARGE_MODEL_RAN)."""
    return any(d not in _CHEAP_DESIGNERS and d != NEIGHBOURHOOD for d in designers)


def _cached_reason(status: str, trial: int, reason: str | None = None) -> str:
    base = f"{status} (same spec as trial {trial})"
    if status == "cached" and reason:
        return reason
    return base if status == "feasible" or not reason else f"{base}: {reason}"


def _reason_class(reason: str) -> str:
    """A failure reason with its numbers blanked, so 'died (exit code -9)' on two candidates with
    different shapes counts as the same reason."""
    import re

    return re.sub(r"\d+(\.\d+)?", "#", " ".join(reason.split()))[:200]
