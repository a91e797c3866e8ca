"""`popkit tune --engine optuna`: optuna's ask/tell proposes the points, from the times of earlier ones.

Each batch of proposals (as many as tune checks at once) is built, checked and timed once (the race's
first round); optuna is told each variant's score, or that it failed, and proposes the next batch. The
input's own values are the first proposal. A point the `tune-if` lines exclude is told as pruned and
costs nothing; a point proposed again is told its known result. The search ends at `max_variants`
variants, when the grid has no untried point, after 20 proposals per variant allowed, or at the budget.
optuna is optional (`pip install 'popkit[tune]'`): this module imports it only when its engine runs.
"""

from __future__ import annotations

from typing import Any

ASKS_PER_VARIANT = 20


def optuna_search(tuner: Any, race: Any) -> int | None:
    """Steps 1-3 and the race's first round, driven by optuna (TPE, seeded); returns the constrained grid's size
    when it could be counted, else None. `tuner` is a popkit.tuning.workflow.Tuner (which imports this module), `race`
    its popkit.tuning.race.Race."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec, settings = tuner.spec, tuner.settings
    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=settings.seed))
    if spec.allows(spec.default):
        study.enqueue_trial(dict(spec.default))
    size = sum(1 for _ in spec.points()) if spec.space_size <= 100_000 else None
    known: dict[tuple, float | None] = {}
    asks, batch = 0, max(2, tuner.jobs)
    while len(known) < settings.max_variants and asks < ASKS_PER_VARIANT * settings.max_variants:
        if (size is not None and len(known) >= size) or (known and tuner.out_of_time()):
            break
        proposals: list[tuple[object, dict]] = []
        taken: set[tuple] = set()
        while (len(proposals) < batch and len(known) + len(proposals) < settings.max_variants
               and asks < ASKS_PER_VARIANT * settings.max_variants):
            trial = study.ask()
            asks += 1
            values = {p.name: trial.suggest_categorical(p.name, list(p.values)) for p in spec.parameters}
            key = tuple(values.values())
            if not spec.allows(values):
                study.tell(trial, state=TrialState.PRUNED)
            elif key in known:
                score = known[key]
                study.tell(trial, score) if score is not None else study.tell(trial, state=TrialState.FAIL)
            elif key in taken:
                study.tell(trial, state=TrialState.PRUNED)  # proposed twice in one batch: it runs once
            else:
                taken.add(key)
                proposals.append((trial, values))
            if size is not None and len(known) + len(proposals) >= size:
                break
        if not proposals:
            break
        tuner.say(f"optuna: {len(proposals)} proposal(s), {len(known)} tried so far")
        states = tuner.add([values for _, values in proposals])
        tuner.build(states)
        tuner.check(states)
        race.time_round([s for s in states if s.passed], 1)
        for (trial, values), state in zip(proposals, states):
            score = state.scores[0] if state.scores else None
            known[tuple(values.values())] = score
            study.tell(trial, score) if score is not None else study.tell(trial, state=TrialState.FAIL)
    tuner.note(f"optuna proposed {asks} point(s); {len(known)} ran")
    return size
