"""`popkit tune`'s race and decision: successive halving, the per-shape file, the A/B confirmations, the file written.

The race times every variant that passed its check with one benchmark-mode eval per round (the order
alternates between rounds, so a drift across a round favours no end of it); after each round the slower
half leaves, by the geometric mean of each variant's round scores (the task's `ranking_by` over the
shapes' times: the median of the eval's timed calls where the eval reports it, else its mean), until
`confirm` finalists are left. Cheap timings pick the finalists; only an A/B (ab.run_ab, rounds of fresh
evals of both sides, a 95% interval over rounds) decides the winner: the finalist whose score interval
against the incumbent lies below 1, the smallest ratio first. When none does, the incumbent's values
stay. Where the finalists' best values differ by shape, the per-shape file (tunefreeze) is one more
candidate, after its own check.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from popkit.check import lint
from popkit.measure import ab
from popkit.model import stats
from popkit.model import tunespec
from popkit.model.contract import entry_points
from popkit.model.results import score_s
from popkit.resources import replace_file
from popkit.run import runner
from popkit.tuning import freeze as tunefreeze
from popkit.tuning.ahead import warm_evals
from popkit.tuning.result import PER_SHAPE, ShapeChoice, Variant
from popkit.tuning.stats import clearly_slower, first_line, halving_evals, race_ratio, race_spec, race_stats

MAX_ROUNDS = 8  # of the race; halving leaves `confirm` variants well before this from up to 2**8 of them
AB_MIN_EVALS = 9  # an A/B's least: a warm-up eval and 4 rounds of two (its first look)
LOOK_ROUNDS = 4  # race rounds the finalists reach before the race's own intervals may decide (the A/B's first look)
# Two sides with different builds get each its own extensions folder: a relative TORCH_EXTENSIONS_DIR lies in each
# eval's working directory (one per side for the whole A/B), so neither rebuilds over the other.
SIDE_EXTENSIONS = ".popkit-torch-extensions"


@dataclass
class State:
    """A variant while tune runs (tuneresult.Variant is what it becomes)."""

    index: int
    values: dict[str, Any]
    label: str
    path: Path
    content: bytes
    sha256: str
    incumbent: bool = False
    build: str = ""
    outcome: str = ""
    message: str = ""
    check_s: float | None = None
    rounds: list[tuple[float, ...]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    left_after: int | None = None
    race_failure: str = ""
    ab: ab.ABReport | None = None
    race_ratio: stats.Interval | None = None  # decided by the race: its score / the incumbent's, paired by round
    resumed: list[str] = field(default_factory=list)
    resumed_check: tuple[str, str] | None = None
    resumed_rounds: list[tuple[float, ...]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    def freeze(self) -> Variant:
        return Variant(index=self.index, label=self.label, values=dict(self.values), sha256=self.sha256,
                       build=self.build, outcome=self.outcome, message=self.message, check_s=self.check_s,
                       rounds=tuple(self.rounds), scores_s=tuple(self.scores), left_after=self.left_after,
                       race_failure=self.race_failure, ab=self.ab, race_ratio=self.race_ratio,
                       resumed=tuple(self.resumed),
                       incumbent=self.incumbent)

    @property
    def score(self) -> float:
        return math.exp(sum(map(math.log, self.scores)) / len(self.scores)) if self.scores else math.inf


@dataclass(frozen=True)
class Outcome:
    """What the race decided: a variant (its index, or PER_SHAPE), or the incumbent's values (winner None)."""

    winner: int | None
    label: str
    confirmed: bool  # decided by A/B verdicts (a winner below 1, or no variant faster than the input)
    state: State | None  # the winning variant; None: the input's own values
    summary: str  # the comment written into the file
    write: bool = True  # False: nothing passed, nothing to write
    decided_by: str = ""  # "A/B", "race" (its rounds separated the finalists), "" (not confirmed)


@dataclass(frozen=True)
class Written:
    path: str = ""
    sha256: str = ""
    check: str = ""


class Race:
    """Steps 4 and 5 of `popkit tune` over a Tuner's checked variants."""

    def __init__(self, tuner: Any):  # popkit.tuning.workflow.Tuner, which imports this module
        self.t = tuner
        self.rounds = 0
        self.composite: State | None = None
        self.choices: list[ShapeChoice] = []
        self._rows: list[tuple[Any, dict, str]] = []  # the per-shape table (shapes, values, benchmark spec)

    # ------------------------------------------------------------------------------------ timing

    def time_round(self, states: Sequence[State], r: int) -> None:
        """Round `r`: one benchmark-mode eval of each state that has fewer rounds (a resumed time counts); one
        at a time on this GPU (through warm pairs started a few at a time ahead: tuning/ahead.py), or one per GPU
        at a time over `devices`."""
        t = self.t
        shapes = len(t.task.cases_for("benchmark"))  # `ranking_by: last`: the last shape alone
        order = [s for s in (states if r % 2 else list(reversed(states))) if len(s.rounds) < r]
        done = [0]

        def one(state: State) -> None:
            if len(state.resumed_rounds) >= r:
                times = state.resumed_rounds[r - 1]
                state.resumed.append(f"round {r}")
            elif t.stopped == "budget":
                return
            else:
                report = t.run(state, "benchmark", t.options_for(state), progress=None if t.devices else t.quiet)
                if report is None:
                    t.say(f"race round {r}: {state.label}: stopped by the time budget")
                    return
                times = race_stats(report, shapes) if report.outcome == "passed" else first_line(report)
            done[0] += 1
            if isinstance(times, str):
                state.race_failure = times or "benchmark mode failed"
                t.say(f"race round {r}: {done[0]}/{len(order)} {state.label}: {state.race_failure}")
                return
            state.rounds.append(times)
            state.scores.append(score_s(list(times), t.task.ranking_by) or math.inf)
            t.say(f"race round {r}: {done[0]}/{len(order)} {state.label}: score {state.scores[-1] * 1e6:.2f} µs")

        if len(t.devices) > 1:
            t.parallel(one, order, jobs=len(t.devices))
            return
        with warm_evals(t, order) as pairs:
            for i, state in enumerate(order):
                if pairs is not None and t.stopped != "budget":
                    pairs.refill([s.index for s in order[i:] if len(s.resumed_rounds) < r])
                one(state)

    def _cut(self, alive: list[State], r: int) -> list[State]:
        """The faster half (at least `confirm`) goes on; from round 2, so does no variant whose interval against
        the leader lies above 1 (paired by round, Bonferroni over the comparisons: the A/B's statistics)."""
        alive = sorted((s for s in alive if not s.race_failure), key=lambda s: s.score)
        keep = max(self.t.settings.confirm, math.ceil(len(alive) / 2))
        out = alive[keep:]
        if r >= 2 and len(alive) > 1:
            slower = set(clearly_slower(alive[0], alive[1:keep]))
            out += [s for s in alive[1:keep] if s.index in slower]
        for state in out:
            state.left_after = r
        return [s for s in alive if s.left_after != r or s is alive[0]]

    def halve(self) -> list[State]:
        """Successive halving until `confirm` are left; returns the finalists, fastest first."""
        t = self.t
        alive = [s for s in t.states if s.passed and not s.race_failure]
        r = min((len(s.rounds) for s in alive), default=0)
        if r:
            alive = self._cut(alive, r)
        while alive and (r == 0 or len(alive) > t.settings.confirm) and r < MAX_ROUNDS:
            need = t.per_eval_s("benchmark") * math.ceil(len(alive) / max(1, len(t.devices)))
            if r and t.out_of_time(need):
                t.note(f"the time budget ended the race after round {r}")
                break
            r += 1
            t.say(f"race round {r}: {len(alive)} variant(s)"
                  + t.left_text("benchmark", halving_evals(len(alive), t.settings.confirm), max(1, len(t.devices))))
            with t.phase("race"):
                self.time_round(alive, r)
            alive = self._cut([s for s in alive if s.scores], r)
            if t.stopped == "budget":
                t.note(f"the time budget stopped the race in round {r}")
                break
        self.rounds = r
        return alive

    # ------------------------------------------------------------------------------- per shape

    def per_shape(self, finalists: Sequence[State]) -> State | None:
        """The per-shape file when the finalists' best values differ by shape and may be set at call time."""
        t = self.t
        cases = t.task.cases_for("benchmark")
        if not t.settings.per_shape or len(finalists) < 2 or len(cases) < 2:
            return None
        best = [min(finalists, key=lambda s, i=i: _shape_median(s, i)) for i in range(len(cases))]
        if len({s.index for s in best}) < 2:
            return None
        names = tuple(entry_points(t.task, t.options.harness) or ("custom_kernel",))
        why = ""
        uses = tunespec.read_time_uses(t.text, t.spec.names)
        if not t.spec.per_call:
            why = "a Triton kernel's config is fixed when its module is imported (its key= picks per shape at run time)"
        elif names != ("custom_kernel",):
            why = f"the task's eval takes {', '.join(names)}, and popkit dispatches custom_kernel only"
        elif uses:
            name, line = next(iter(uses.items()))
            why = f"{name} is read while the file is imported (line {line}), so it cannot change per call"
        elif len({t.identities[s.sha256].key for s in finalists}) > 1:
            why = "the finalists build different extensions"
        shapes: list | None = None
        if not why:
            with t.phase("probe"):
                shapes, why = t.backend.shapes(t.task, t.options, t.content)
        if shapes is None or len(shapes) != len(cases):
            t.note(f"the best values differ by shape, but one set is written: {why or 'no input shapes'}")
            return None
        default = finalists[0]
        table: dict[tuple, State] = {}
        for state, key, case in zip(best, shapes, cases):
            if table.setdefault(key, state) is not state:
                t.note(f"benchmarks with the inputs of `{race_spec(case)}` share their shapes: the first one's values"
                       " are written for both")
        self.choices = [ShapeChoice(race_spec(c), key, table[key].label) for key, c in zip(shapes, cases)]
        rows = [(key, state.values, race_spec(cases[shapes.index(key)])) for key, state in table.items()
                if state is not default]
        text = tunefreeze.per_shape_text(t.text, t.spec, default.values, rows, "per-shape values (being checked)")
        path = t.root / "variants" / f"{t.path.stem}.per-shape.py"
        path.write_text(text, encoding="utf-8")
        content = text.encode("utf-8")
        state = State(index=PER_SHAPE, values=dict(default.values), label="per shape", path=path, content=content,
                      sha256=hashlib.sha256(content).hexdigest(), build=default.build)
        t.identities[state.sha256] = t.identities[default.sha256]
        t.say("per-shape file: check")
        t.check([state])
        self.composite = state
        if not state.passed:
            t.note(f"the per-shape file is not a candidate: {state.message}" if not state.outcome else
                   f"the per-shape file did not pass its check ({state.message}): not a candidate")
            return None
        self._rows = rows
        return state

    # --------------------------------------------------------------------------------- confirming

    def ab_options(self, state: State) -> runner.RunOptions:
        t = self.t
        mine, theirs = t.identities[state.sha256].key, t.identities[t.incumbent.sha256].key
        if mine == theirs:
            return replace(t.options_for(state), label="")
        return replace(t.options, label="", secret_seeds=(), precompile=True,
                       env={**t.options.env, "TORCH_EXTENSIONS_DIR": SIDE_EXTENSIONS})

    def incumbent_passes(self) -> bool:
        """The incumbent's tests (its variant's check when it is one); it must pass to be a yardstick."""
        t = self.t
        state = next((s for s in t.states if s.sha256 == t.incumbent.sha256), None)
        if state is None:
            state = t.incumbent
            if not state.outcome:
                t.build([state])
                t.check([state])
        if not state.passed:
            t.note(f"the incumbent {t.incumbent.path.name} did not pass its tests ({state.message or 'not run'}): "
                   "no A/B; the race's fastest is written unconfirmed")
        return state.passed

    def confirm(self, candidates: Sequence[State]) -> bool:
        """Each candidate against the incumbent; False when no A/B could be run (the incumbent failed)."""
        t = self.t
        if not self.incumbent_passes():
            return False
        ran = False
        for state in candidates:
            if state.sha256 == t.incumbent.sha256:
                continue
            need = t.per_eval_s("benchmark") * AB_MIN_EVALS
            if t.out_of_time(need):
                t.note(f"the time budget ran out before the A/B of {state.label} (it takes about {need:.0f} s)")
                continue
            left = t.remaining_s()
            budget = t.settings.ab_budget_s if left is None else max(1.0, min(t.settings.ab_budget_s, left))
            t.say(f"A/B: {state.label} against {t.incumbent.path.name}")
            options = self.ab_options(state)
            if t.devices:  # both sides of an A/B on one GPU
                options = replace(options, env={**options.env, "CUDA_VISIBLE_DEVICES": t.devices[0]})
            with t.phase("A/B"):
                report = t.backend.compare(t.task, t.incumbent.path, state.path, options,
                                           max_rounds=t.settings.ab_rounds, budget_s=budget, progress=t.quiet,
                                           system=t.sysinfo)
                t.count_evals(len(report.eval_s))
            state.ab, ran = report, True
            for side, content in (("A", t.incumbent.content), ("B", state.content)):
                side_report = ab.side_report(report, side, t.task)
                if side_report is not None:
                    t.record(side_report, content)
            if report.failed_side == "A":
                t.note(f"the incumbent failed in its A/B against {state.label}: no further A/B")
                return False
        return ran

    # --------------------------------------------------------------------------------- deciding

    def settle(self, finalists: list[State]) -> tuple[State | None, list[State]]:
        """The finalists and the incumbent's own variant race on to LOOK_ROUNDS rounds; when the leader's interval
        against every other lies below 1, the race decides (returns the leader) and no A/B runs. Else returns the
        finalists an A/B must still separate: the leader and those within the race's noise of it."""
        t = self.t
        yard = next((s for s in t.states if s.sha256 == t.incumbent.sha256 and s.passed and not s.race_failure), None)
        if yard is None or not t.settings.race_decides or len(finalists) < 1:
            return None, finalists
        group = list(finalists) + ([yard] if yard not in finalists else [])
        if len(group) < 2:
            return None, finalists
        r = self.rounds
        while any(len(s.scores) < LOOK_ROUNDS for s in group) and r < MAX_ROUNDS:
            if t.out_of_time(t.per_eval_s("benchmark") * len(group)):
                t.note(f"the time budget ended the race after round {r}")
                return None, finalists
            r += 1
            t.say(f"race round {r}: {len(group)} variant(s), toward the race's look at round {LOOK_ROUNDS}"
                  + t.left_text("benchmark", len(group) * (LOOK_ROUNDS - r + 1)))
            with t.phase("race"):
                self.time_round(group, r)
            group = [s for s in group if not s.race_failure]
            if t.stopped == "budget":
                self.rounds = r
                t.note(f"the time budget stopped the race in round {r}")
                return None, [s for s in finalists if s.scores]
            if yard not in group or not group:
                self.rounds = r
                return None, [s for s in finalists if not s.race_failure]
        self.rounds = max(self.rounds, r)
        group.sort(key=lambda s: s.score)
        leader, others = group[0], group[1:]
        slower = set(clearly_slower(leader, others))
        if len(slower) == len(others):
            if leader is not yard:
                leader.race_ratio = race_ratio(leader, yard)
            return leader, []
        near = [s for s in finalists if not s.race_failure and (s is leader or s.index not in slower)]
        dropped = [s.label for s in finalists if s not in near]
        if dropped:
            t.note(f"no A/B for {', '.join(dropped)}: slower than {leader.label} in the race's {LOOK_ROUNDS} rounds")
        return None, near

    def estimate(self) -> str:
        """What the race and its decision will take, from the evals timed so far, said before the race starts."""
        t = self.t
        alive = [s for s in t.states if s.passed and not s.race_failure]
        each = t.per_eval_s("benchmark") or t.per_eval_s("test")
        if not alive or not each:
            return ""
        evals = halving_evals(len(alive), t.settings.confirm) + t.settings.confirm * (LOOK_ROUNDS - 1)
        ab_evals = AB_MIN_EVALS * t.settings.confirm
        left = t.remaining_s()
        budget = f"; {left:.0f} s of the budget left" if left is not None else ""
        return (f"estimate: race about {evals} evals (~{evals * each / max(1, len(t.devices)):.0f} s at ~{each:.0f} s an"
                f" eval), then an A/B only if the race cannot separate its finalists (~{ab_evals * each:.0f} s)"
                f"{budget}")

    def run(self) -> Outcome:
        t = self.t
        said = self.estimate()
        if said:
            t.say(said)
        finalists = self.halve()
        if not finalists:
            return Outcome(None, "", False, None, "", write=False)
        composite = self.per_shape(finalists)
        device = t.sysinfo.get("device") or "this machine"
        if composite is None:
            decided, finalists = self.settle(finalists)
            if decided is not None:
                return self.by_race(decided, device)
        candidates = list(finalists) + ([composite] if composite else [])
        ran = self.confirm(candidates)
        yardstick = ran or any(s.sha256 == t.incumbent.sha256 for s in finalists)
        faster = [s for s in candidates if s.ab is not None and s.ab.verdict == ab.B_FASTER and not s.ab.failed_side]
        if faster:
            best = min(faster, key=lambda s: s.ab.score.ratio.estimate)  # type: ignore[union-attr]
            ratio = best.ab.score.ratio  # type: ignore[union-attr]
            summary = (f"{best.label} chosen on {device}: {ratio.estimate:.3f}x the time of {t.incumbent.path.name}"
                       f" (95% interval {ratio.low:.3f} to {ratio.high:.3f}, A/B over {best.ab.rounds} rounds)")
            return Outcome(best.index, best.label, True, best, summary, decided_by="A/B")
        if yardstick and t.incumbent.sha256 == t.content_sha256 and (ran or finalists[0].sha256 == t.incumbent.sha256):
            label = tunespec.label(t.spec.default)
            why = "no variant was faster than the input in an A/B" if ran else "the input's own values won the race"
            return Outcome(None, label, ran, None, f"kept {label}: {why} on {device}", decided_by="A/B" if ran else "")
        best = finalists[0]
        why = ("no variant was faster than the --against file" if ran else
               "the time budget ran out before its A/B" if t.stopped == "budget" else "no A/B could run")
        t.note(f"{best.label} is written unconfirmed: {why}")
        summary = f"{best.label}: the race's fastest on {device}, not confirmed by an A/B ({why})"
        return Outcome(best.index, best.label, False, best, summary)

    def so_far(self) -> Outcome:
        """What tune knows when it is stopped (Ctrl-C): a variant an A/B confirmed, else the race's fastest so far
        (unconfirmed), else nothing to write."""
        t = self.t
        device = t.sysinfo.get("device") or "this machine"
        states = t.states + ([self.composite] if self.composite else [])
        faster = [s for s in states if s.ab is not None and s.ab.verdict == ab.B_FASTER and not s.ab.failed_side]
        if faster:
            best = min(faster, key=lambda s: s.ab.score.ratio.estimate)  # type: ignore[union-attr]
            return Outcome(best.index, best.label, True, best, f"{best.label} confirmed faster by an A/B on {device};"
                           " tune was stopped before the rest", decided_by="A/B")
        raced = sorted((s for s in t.states if s.passed and s.scores and not s.race_failure), key=lambda s: s.score)
        if not raced:
            t.note("tune was stopped before any variant was timed: nothing written")
            return Outcome(None, "", False, None, "", write=False)
        best = raced[0]
        t.note(f"{best.label} is written unconfirmed: the race's fastest when tune was stopped")
        return Outcome(best.index, best.label, False, best, f"{best.label}: the race's fastest on {device} when tune "
                       f"was stopped after {len(best.scores)} round(s), not confirmed")

    def by_race(self, leader: State, device: str) -> Outcome:
        """The race's rounds separated its leader from every other finalist and from the incumbent: no A/B."""
        t = self.t
        n = len(leader.scores)
        if leader.sha256 == t.incumbent.sha256 == t.content_sha256:
            label = tunespec.label(t.spec.default)
            return Outcome(None, label, True, None, f"kept {label}: every other finalist was slower in the race's "
                                                    f"{n} rounds on {device}", decided_by="race")
        ratio = leader.race_ratio
        if ratio is None:  # the --against file's own bytes, one of the variants, led
            return Outcome(leader.index, leader.label, True, leader, f"{leader.label} (the values of "
                           f"{t.incumbent.path.name}) led every other finalist in the race's {n} rounds on {device}",
                           decided_by="race")
        summary = (f"{leader.label} chosen on {device}: {ratio.estimate:.3f}x the time of {t.incumbent.path.name}"
                   f" (95% interval {ratio.low:.3f} to {ratio.high:.3f}, race over {n} rounds)")  # type: ignore
        return Outcome(leader.index, leader.label, True, leader, summary, decided_by="race")

    def text(self, outcome: Outcome) -> str:
        t = self.t
        if outcome.winner == PER_SHAPE:
            return tunefreeze.per_shape_text(t.text, t.spec, outcome.state.values, self._rows,  # type: ignore
                                             outcome.summary)
        values = outcome.state.values if outcome.state is not None else t.spec.default
        return tunefreeze.frozen_text(t.text, t.spec, values, outcome.summary)

    def write(self, output: Path, outcome: Outcome) -> Written:
        """The winner's file: checked once more (tests, `popkit check`), then written to `output` if it passed."""
        t = self.t
        if not outcome.write:
            return Written()
        content = self.text(outcome).encode("utf-8")
        errors = [f"{d.location}: {d.message}" for d in lint.check_bytes(content, output.name, guard=False).errors]
        if errors:
            t.note(f"popkit check finds {len(errors)} error(s) in the tuned file (the input's own?): {errors[0]}")
        staged = t.root / output.name
        staged.write_bytes(content)
        sha = hashlib.sha256(content).hexdigest()
        source = outcome.state or next((s for s in t.states if s.sha256 == t.incumbent.sha256), t.incumbent)
        t.identities[sha] = t.identities[source.sha256]
        proxy = State(index=-3, values={}, label="tuned file", path=staged, content=content, sha256=sha)
        report = None
        if t.stopped not in ("budget", "interrupted"):
            t.say(f"final check of {output.name}")
            report = t.run(proxy, "test", t.options_for(proxy, label="tune: written file"))
        if report is None and not source.passed:
            t.note("the final check could not run (the time budget): not written")
            return Written()
        if report is None:
            why = "tune was stopped" if t.stopped == "interrupted" else "the time budget ran out"
            t.note(f"the final check did not run ({why}): the file written is {source.label}, which passed the "
                   "tests, with its values frozen and a comment added")
            check = "skipped"
        elif report.outcome != "passed":
            t.note(f"the tuned file did not pass its final check ({first_line(report)}): not written")
            return Written(check=report.outcome)
        else:
            check = report.outcome
        replace_file(output, content)
        return Written(str(output), sha, check)


def _shape_median(state: State, shape: int) -> float:
    values = sorted(r[shape] for r in state.rounds)
    return stats.median(values) if values else math.inf


__all__ = ["AB_MIN_EVALS", "LOOK_ROUNDS", "MAX_ROUNDS", "Outcome", "Race", "State", "Written"]
