"""`popkit tune`: the workflow over a stand-in backend (fast), the command's refusals, and real runs on the
CPU fixture task (slow): a wrong value dropped by name, a slow one never chosen, the file written passing
`popkit test`; a cheating variant failing like any submission under popkit's harness."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.check import lint
from popkit.cli import app
from popkit.errors import EnvironmentProblem, ExitCode, SubmissionError, UsageError
from popkit.ledger import history
from popkit.measure import ab
from popkit.model import tunespec
from popkit.model.diagnostics import Diagnostic
from popkit.model.results import CaseResult, CompileStep, ModeRun, RunReport
from popkit.model.tasks import load_task
from popkit.run import protocol
from popkit.run import runner
from popkit.tuning import ahead
from popkit.tuning import race as tunerace
from popkit.tuning import stats as tunestats
from popkit.tuning import workflow as tune
from popkit.tuning.probe import Identity
from popkit.tuning.race import SIDE_EXTENSIONS
from popkit.tuning.result import PER_SHAPE, TuneReport

ROOT = Path(__file__).resolve().parents[1]
TASK_DIR = ROOT / "tests" / "fixtures" / "tasks" / "chunksum"
SUBMISSION = ROOT / "tests" / "fixtures" / "tune" / "chunksum.py"
CHEAT = ROOT / "tests" / "fixtures" / "tune" / "chunksum_cheat.py"
SHAPES = [((4096,),), ((8192,),)]  # the fixture's benchmark inputs
# ns per benchmark shape for each CHUNK; None: a wrong output
TIMES = {1: (200e3, 400e3), 256: (20e3, 40e3), 1000: None, 4096: (5e3, 10e3)}


def _table(text: str) -> tuple[dict | None, dict | None]:
    """The per-shape file's table and default, read back from its text."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("_POPKIT_BY_SHAPE", "_POPKIT_DEFAULT"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found.get("_POPKIT_BY_SHAPE"), found.get("_POPKIT_DEFAULT")


class Fake:
    """A backend whose evals are decided by each file's CHUNK (`times`), with 1% noise per eval."""

    def __init__(self, times=TIMES, identities=None, build=None):
        self.times, self.calls, self.rng = times, Counter(), random.Random(5)
        self.builds: list[str] = []
        self.options: list[runner.RunOptions] = []
        self.ab_options: list[runner.RunOptions] = []
        self.backend = tune.Backend(run=self.run, compare=functools.partial(ab.run_ab, run_eval=self.run_eval),
                                    identities=identities or tune.Backend.identities,
                                    build=build or self.build, shapes=lambda task, options, content: (SHAPES, ""))

    def per_shape(self, text: str) -> list[tuple[float, ...] | None]:
        table, default = _table(text)
        if table is None:
            chunk = tunespec.parse(text, "v.py").default["CHUNK"]
            return [self.times[chunk]] * len(SHAPES)
        return [self.times[table.get(key, default)["CHUNK"]] for key in SHAPES]

    def cases(self, text: str, kind: str, cases) -> tuple[CaseResult, ...]:
        rows = self.per_shape(text)
        out = []
        for i, case in enumerate(cases):
            spec = "; ".join(f"{k}: {v}" for k, v in case.items())
            times = rows[i if i < len(rows) else 0]
            if times is None:
                out.append(CaseResult(kind, i, spec, False, error="sum 1.0, expected 2.0"))
            elif kind == "test":
                out.append(CaseResult(kind, i, spec, True))
            else:
                t = times[SHAPES.index(((case["size"],),))] * (1 + 0.01 * self.rng.random())
                out.append(CaseResult(kind, i, spec, True, runs=10, mean_ns=t, median_ns=t))
        return tuple(out)

    def mode_run(self, text: str, mode: str, cases) -> ModeRun:
        kind = "test" if mode == "test" else "benchmark"
        found = self.cases(text, kind, cases)
        ok = all(c.passed for c in found)
        run = ModeRun(mode=mode, secret=False, seed=None, exit_code=0 if ok else 112, duration_s=0.5, timeout_s=60,
                      check="pass" if ok else "fail", **{"tests" if kind == "test" else "benchmarks": found})
        outcome, summary = protocol.classify(run)
        return ModeRun(**{**run.__dict__, "outcome": outcome, "summary": summary})

    def run(self, task, path, mode, options, progress=None, system=None, content=None) -> RunReport:
        text = Path(path).read_text()
        self.calls[(mode, options.label)] += 1
        self.options.append(options)
        run = self.mode_run(text, mode, task.cases_for(mode))
        return RunReport(task=task.name, task_path=str(task.path), leaderboard=task.leaderboard,
                         ranking_by=task.ranking_by, submission=str(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                         mode=mode, harness=options.harness, started_at="2026-11-26T12:00:00+00:00", duration_s=0.5,
                         system=dict(system or {}), runs=(run,), label=options.label)

    def run_eval(self, workspace, main, mode, shapes, **kw) -> ModeRun:
        text = (workspace.files / "submission.py").read_text()
        self.calls[("ab", self.label(text))] += 1
        self.ab_options.append(kw["options"])
        return self.mode_run(text, mode, shapes)

    def build(self, task, path, content, options, progress=None):
        self.builds.append(options.env["TORCH_EXTENSIONS_DIR"])
        return CompileStep(exit_code=0, duration_s=1.0), ""

    @staticmethod
    def label(text: str) -> str:
        return "per shape" if "_POPKIT_BY_SHAPE" in text else tunespec.label(tunespec.parse(text, "v.py").default)


@pytest.fixture
def task():
    return load_task(TASK_DIR)


def settings(**kw) -> tune.TuneSettings:
    return tune.TuneSettings(**{"ab_rounds": 4, "record": False, "per_shape": False, "race_decides": False, **kw})


def by_label(report: TuneReport) -> dict:
    return {v.label: v for v in report.variants}


def run(task, tmp_path, fake, source=SUBMISSION, **kw) -> TuneReport:
    return tune.run_tune(task, source, tmp_path / "out.py", runner.RunOptions(), kw.pop("settings", settings()),
                         backend=fake.backend, **kw)


# ------------------------------------------------------------------------------------ the workflow


def test_drops_the_wrong_value_by_name_races_out_the_slow_one_and_writes_the_winner(task, tmp_path):
    fake = Fake()
    report = run(task, tmp_path, fake)
    v = by_label(report)
    assert report.exit_code == ExitCode.OK and report.grid_points == 4 and report.builds == 0
    assert v["CHUNK=1000"].outcome == "failed"
    assert v["CHUNK=1000"].message == "check failed: test, test size: 4096; seed: 1: sum 1.0, expected 2.0"
    assert v["CHUNK=1"].left_after == 1 and v["CHUNK=1"].ab is None  # raced out: never a finalist
    assert v["CHUNK=256"].incumbent and v["CHUNK=256"].ab is None  # the input itself: no A/B against itself
    assert v["CHUNK=4096"].faster and v["CHUNK=4096"].ratio.high < 1
    assert (report.winner, report.winner_label, report.confirmed) == (v["CHUNK=4096"].index, "CHUNK=4096", True)
    text = (tmp_path / "out.py").read_text()
    assert "\nCHUNK = 4096\n" in text and text.startswith("#!POPKIT tune CHUNK=1,256,1000,4096\n# popkit tune: "
                                                           "CHUNK=4096 chosen on ")
    assert report.output_sha256 == hashlib.sha256(text.encode()).hexdigest() and report.final_check == "passed"
    assert lint.check_bytes(text.encode(), "out.py", guard=False).ok
    assert fake.calls[("test", "tune CHUNK=1000")] == 1 and fake.calls[("benchmark", "tune CHUNK=1000")] == 0
    assert fake.calls[("benchmark", "tune CHUNK=1")] == 1 and fake.calls[("ab", "CHUNK=1")] == 0
    assert fake.calls[("test", "tune: written file")] == 1
    assert TuneReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    assert SUBMISSION.read_text().count("\nCHUNK = 256\n") == 1  # the input is untouched


def test_a_task_ranked_by_its_last_shape_races_on_the_shape_its_evals_are_given(task, tmp_path):
    """Under `ranking_by: last` a benchmark eval is given the last shape alone (Task.cases_for, as the runner
    does); the race once counted the task's every shape and dropped each variant (pmpp_v2 vectoradd on an H100)."""
    from dataclasses import replace

    report = run(replace(task, ranking_by="last"), tmp_path, Fake())
    v = by_label(report)
    assert not [x.race_failure for x in report.variants if x.race_failure]
    assert v["CHUNK=1"].left_after == 1 and report.winner_label == "CHUNK=4096" and report.confirmed


def test_race_stats_says_why_a_passed_report_cannot_be_raced(task):
    fake = Fake()
    report = fake.run(task, SUBMISSION, "benchmark", runner.RunOptions())
    assert tunestats.race_stats(report, 2) == tuple(c.median_ns for c in report.runs[0].benchmarks)
    assert tunestats.race_stats(report, 3) == "its eval reported 2 of the 3 benchmark shape(s) it was given"
    assert tunestats.race_stats(fake.run(task, SUBMISSION, "test", runner.RunOptions()), 2) == \
        "no passed benchmark run in its report (runs: test: passed)"


def test_the_report_ranks_names_the_dropped_and_says_what_was_written(task, tmp_path, capsys, monkeypatch):
    from popkit.views import tuning as view

    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    report = run(task, tmp_path, Fake())
    view.show_tune(report)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"popkit tune · task chunksum · {SUBMISSION} · 4 variants (grid of 4) · 0 builds · "
                               "1 race round(s) · harness task · ")
    rows = [line.split()[0] for line in lines if line.startswith(" CHUNK=")]
    assert rows == ["CHUNK=4096", "CHUNK=256", "CHUNK=1"]  # the winner, then by race score
    assert "winner" in next(line for line in lines if line.startswith(" CHUNK=4096")) and "faster" in out
    assert "dropped CHUNK=1000: check failed: test, test size: 4096; seed: 1: sum 1.0, expected 2.0" in out
    assert f"wrote {tmp_path / 'out.py'}: CHUNK=4096: " in out and "the time of chunksum.py, confirmed by an A/B" in out
    view.show_tune(report, json=True)
    assert json.loads(capsys.readouterr().out)["schema"] == "popkit/tune/1"


def test_no_faster_variant_keeps_the_inputs_values(task, tmp_path):
    fake = Fake({**TIMES, 4096: (20e3, 40e3)})  # as fast as the input's 256, no faster
    report = run(task, tmp_path, fake)
    assert report.winner is None and report.confirmed and report.exit_code == ExitCode.OK
    assert by_label(report)["CHUNK=4096"].ab is not None and not by_label(report)["CHUNK=4096"].faster
    text = (tmp_path / "out.py").read_text()
    assert "\nCHUNK = 256\n" in text and "# popkit tune: kept CHUNK=256: no variant was faster" in text


def test_against_another_file_and_a_wrong_incumbent(task, tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text(SUBMISSION.read_text().replace("\nCHUNK = 256\n", "\nCHUNK = 1000\n"))
    report = run(task, tmp_path, Fake(), source=wrong)  # its own values fail: nothing to confirm against
    assert report.winner_label == "CHUNK=4096" and not report.confirmed
    assert any("the incumbent wrong.py did not pass its tests" in n for n in report.notes)
    report = tune.run_tune(task, wrong, tmp_path / "o2.py", runner.RunOptions(), settings(), against=SUBMISSION,
                           backend=Fake().backend)
    assert report.incumbent == str(SUBMISSION) and report.confirmed and report.winner_label == "CHUNK=4096"


@pytest.mark.slow
def test_variants_with_one_build_key_build_once_and_a_failed_build_drops_its_own(task, tmp_path):
    fake = Fake()
    shared = lambda task, contents, options: [Identity("k" * 64, True, ("ext",)) for _ in contents]  # noqa: E731
    fake.backend = tune.Backend(**{**fake.backend.__dict__, "identities": shared})
    report = run(task, tmp_path, fake)
    assert report.builds == 1 and len(fake.builds) == 1 and fake.builds[0].endswith("tune-" + "k" * 16)
    checks = [o for o in fake.options if o.label.startswith("tune CHUNK")]
    assert checks and all(o.precompile is False and o.env["TORCH_EXTENSIONS_DIR"] == fake.builds[0] for o in checks)

    def per_value(task, contents, options):
        return [Identity(hashlib.sha256(tunespec.label(tunespec.parse(c.decode(), "v").default).encode()).hexdigest(),
                         True) for c in contents]

    def failing(task, path, content, options, progress=None):
        chunk = tunespec.parse(content.decode(), "v").default["CHUNK"]
        if chunk != 4096:
            return CompileStep(exit_code=0, duration_s=1.0), ""
        bad = Diagnostic("error", "nvcc", 'identifier "q" is undefined', str(path), 12, 5)
        return CompileStep(exit_code=1, duration_s=1.0, stderr="Error building extension 'ext'", diagnostics=(bad,)), ""

    fake = Fake()
    fake.backend = tune.Backend(**{**fake.backend.__dict__, "identities": per_value})
    report = run(task, tmp_path / "a", fake)
    assert report.builds == 4 and report.winner_label == "CHUNK=4096"
    # The A/B's sides build differently: each builds into its own working folder, never one over the other.
    assert {(o.env["TORCH_EXTENSIONS_DIR"], o.precompile) for o in fake.ab_options} == {(SIDE_EXTENSIONS, True)}

    fake = Fake()
    fake.backend = tune.Backend(**{**fake.backend.__dict__, "identities": per_value, "build": failing})
    report = run(task, tmp_path / "b", fake)
    v = by_label(report)
    assert report.builds == 4 and v["CHUNK=4096"].outcome == "compile_failed"
    assert v["CHUNK=4096"].message.startswith("compile failed: ") and v["CHUNK=4096"].message.endswith(
        ':12:5: identifier "q" is undefined')
    assert fake.calls[("test", "tune CHUNK=4096")] == 0 and report.winner is None  # 256 (the input) stays


def test_the_best_differing_by_shape_writes_a_dispatch_that_wins_its_ab(task, tmp_path):
    fake = Fake({1: (900e3, 900e3), 256: (5e3, 40e3), 1000: None, 4096: (20e3, 10e3)})
    report = run(task, tmp_path, fake, settings=settings(per_shape=True))
    assert report.winner == PER_SHAPE and report.winner_label == "per shape" and report.confirmed
    assert [(c.spec, c.shapes, c.label) for c in report.per_shape] == [
        ("size: 4096; seed: 3", ((4096,),), "CHUNK=256"), ("size: 8192; seed: 4", ((8192,),), "CHUNK=4096")]
    text = (tmp_path / "out.py").read_text()
    table, default = _table(text)
    assert default["CHUNK"] in (256, 4096) and "#!POPKIT" not in text
    assert all(values["CHUNK"] != default["CHUNK"] for values in table.values())
    torch = pytest.importorskip("torch")
    module: dict = {}
    exec(compile(text, "out.py", "exec"), module)
    for size in (4096, 8192, 12288):
        x = torch.randn(size)
        assert torch.allclose(module["custom_kernel"](x), x.double().sum().float(), atol=1e-3)


def test_a_value_read_at_import_gets_one_set_for_every_shape(task, tmp_path):
    source = tmp_path / "import_time.py"
    source.write_text(SUBMISSION.read_text().replace("CHUNK = 256\n", "CHUNK = 256\nSTEP = CHUNK\n"))
    fake = Fake({1: (900e3, 900e3), 256: (5e3, 40e3), 1000: None, 4096: (20e3, 10e3)})
    report = run(task, tmp_path, fake, source=source, settings=settings(per_shape=True))
    assert report.winner != PER_SHAPE and not report.per_shape
    line = source.read_text().splitlines().index("STEP = CHUNK") + 1
    assert any(f"CHUNK is read while the file is imported (line {line})" in n for n in report.notes)


def test_gpus_spread_checks_and_race_evals_one_per_gpu_and_the_ab_on_the_first(task, tmp_path):
    fake = Fake()
    report = run(task, tmp_path, fake, devices=("0", "3"))
    assert report.exit_code == ExitCode.OK and report.winner_label == "CHUNK=4096"
    assert {o.env["CUDA_VISIBLE_DEVICES"] for o in fake.options} == {"0", "3"}
    assert {o.env["CUDA_VISIBLE_DEVICES"] for o in fake.ab_options} == {"0"}


def test_budget_stops_new_work_and_says_so(task, tmp_path):
    ticks = iter(range(0, 10**6, 400))  # every look at the clock: 400 s later
    report = run(task, tmp_path, Fake(), settings=settings(budget_s=1000), clock=lambda: next(ticks))
    assert report.stopped == "budget"
    assert any(v.message == "not checked: the time budget ran out" for v in report.variants)


def test_resume_reuses_checks_and_race_times_from_the_history(task, tmp_path):
    first = Fake()
    run(task, tmp_path, first, settings=settings(record=True))
    assert len(history.local_runs(hashlib.sha256(SUBMISSION.read_bytes()).hexdigest(), task.name)) >= 2
    again = Fake()
    report = run(task, tmp_path / "2", again, settings=settings(record=True, resume=True))
    assert {k: n for k, n in again.calls.items() if k[0] in ("test", "benchmark")} == {("test", "tune: written file"): 1}
    assert {v.label: v.resumed for v in report.variants if v.resumed}["CHUNK=4096"] == ("check", "round 1")
    assert report.winner_label == "CHUNK=4096"


def test_optuna_engine_finds_the_winner_within_its_budget_of_variants(task, tmp_path):
    pytest.importorskip("optuna")
    fake = Fake()
    report = run(task, tmp_path, fake, settings=settings(engine="optuna", max_variants=3, jobs=2))
    assert report.engine == "optuna" and report.grid_points == 4 and report.exit_code == ExitCode.OK
    labels = [v.label for v in report.variants]
    assert len(labels) == len(set(labels)) == 3 and labels[0] == "CHUNK=256"  # the input's values first
    assert report.winner_label not in ("CHUNK=1", "CHUNK=1000")
    assert any(n.startswith("optuna proposed ") for n in report.notes)


# ------------------------------------------------------------------------------------ refusals


def test_refusals_before_anything_runs(task, tmp_path):
    with pytest.raises(UsageError, match="is the input file: popkit tune never overwrites it"):
        tune.run_tune(task, SUBMISSION, SUBMISSION, settings=settings())
    existing = tmp_path / "there.py"
    existing.write_text("x = 1\n")
    with pytest.raises(UsageError, match="already exists; not overwriting it"):
        tune.run_tune(task, SUBMISSION, existing, settings=settings())
    with pytest.raises(UsageError, match="the tuned submission is Python"):
        tune.run_tune(task, SUBMISSION, tmp_path / "o.cu", settings=settings())
    plain = tmp_path / "plain.py"
    plain.write_text("def custom_kernel(data):\n    return data.sum()\n")
    with pytest.raises(SubmissionError, match="no `#!POPKIT tune NAME=V1,V2,...` line: nothing to tune"):
        tune.run_tune(task, plain, tmp_path / "o.py", settings=settings())
    with pytest.raises(UsageError, match="unknown engine `anneal`"):
        tune.run_tune(task, SUBMISSION, tmp_path / "o.py", settings=settings(engine="anneal"))


def test_the_optuna_engine_without_optuna_is_exit_11(task, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optuna(name, *args, **kw):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    with pytest.raises(EnvironmentProblem) as info:
        tune.run_tune(task, SUBMISSION, tmp_path / "o.py", settings=settings(engine="optuna"))
    assert info.value.exit_code == ExitCode.ENVIRONMENT and info.value.hint == "pip install 'popkit[tune]'"


@pytest.mark.parametrize("args,code,message", [
    (["-o", str(SUBMISSION)], 2, "is the input file: popkit tune never overwrites it"),
    (["-o", "OUT", "--rounds", "5"], 2, "--rounds 5: the A/B runs rounds in pairs (ABBA)"),
    (["-o", "OUT", "--engine", "anneal"], 2, "unknown engine `anneal`"),
])
def test_cli_refusals(args, code, message, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "o.py")) for a in args]
    result = CliRunner().invoke(app, ["tune", str(SUBMISSION), "--task", str(TASK_DIR), *args, "--json"])
    assert result.exit_code == code, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "popkit/error/1" and message in doc["message"]


def test_cli_without_declarations_is_exit_4(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("def custom_kernel(data):\n    return data.sum()\n")
    result = CliRunner().invoke(app, ["tune", str(plain), "--task", str(TASK_DIR), "-o", str(tmp_path / "o.py")])
    assert result.exit_code == 4
    assert f"error: {plain}: no `#!POPKIT tune NAME=V1,V2,...` line: nothing to tune" in result.output


# --------------------------------------------------------------------------------- real evals, CPU


@pytest.mark.slow
def test_cpu_tune_end_to_end_then_popkit_test_passes_the_file(tmp_path):
    out = tmp_path / "tuned.py"
    result = CliRunner().invoke(app, ["tune", str(SUBMISSION), "--task", str(TASK_DIR), "-o", str(out),
                                      "--rounds", "4", "--json", "--no-history"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    variants = {v["label"]: v for v in doc["variants"]}
    assert variants["CHUNK=1000"]["outcome"] == "failed"
    assert variants["CHUNK=1000"]["message"].startswith("check failed: test, test size: 4096; seed: 1: sum ")
    assert doc["winner_label"] not in ("CHUNK=1", "CHUNK=1000")
    assert variants["CHUNK=1"]["left_after"] == 1  # the slow one leaves after the first round
    chosen = doc["winner_label"].split("=")[1] if doc["winner_label"] else "256"
    assert f"\nCHUNK = {chosen}\n" in out.read_text()
    tested = CliRunner().invoke(app, ["test", str(out), "--task", str(TASK_DIR), "--no-history"])
    assert tested.exit_code == 0, tested.output


@pytest.mark.slow
def test_a_cheating_variant_fails_its_check_under_popkits_harness(tmp_path):
    result = CliRunner().invoke(app, ["tune", str(CHEAT), "--task", str(TASK_DIR), "-o", str(tmp_path / "o.py"),
                                      "--harness", "popkit", "--confirm", "1", "--json", "--no-history"])
    assert result.exit_code == 0, result.output
    variants = {v["label"]: v for v in json.loads(result.stdout)["variants"]}
    assert variants["CHUNK=0"]["outcome"] == "failed"
    assert "input 0 was modified by custom_kernel" in variants["CHUNK=0"]["message"]
    assert variants["CHUNK=4096"]["outcome"] == "passed"


@pytest.mark.slow
def test_a_crashing_variant_is_dropped_with_the_exception_it_raised(tmp_path):
    crashing = tmp_path / "crashing.py"
    crashing.write_text(SUBMISSION.read_text().replace(
        "def custom_kernel(data):\n",
        "def custom_kernel(data):\n    if CHUNK == 1000:\n        first, second = data\n"))
    # the task's own eval crashes with the exception (popkit's harness reports it as the case's failure instead)
    result = CliRunner().invoke(app, ["tune", str(crashing), "--task", str(TASK_DIR), "-o", str(tmp_path / "o.py"),
                                      "--harness", "task", "--confirm", "1", "--rounds", "4", "--json", "--no-history"])
    assert result.exit_code == 0, result.output
    variants = {v["label"]: v for v in json.loads(result.stdout)["variants"]}
    assert variants["CHUNK=1000"]["outcome"] == "crashed"
    assert variants["CHUNK=1000"]["message"].endswith("ValueError: too many values to unpack (expected 2)")


def test_the_exception_line_is_the_last_line_a_traceback_raised():
    stderr = ("Traceback (most recent call last):\n  File \"eval.py\", line 3, in <module>\n"
              "    raise KeyError('x')\nKeyError: 'x'\n\nDuring handling ...\ntorch.OutOfMemoryError: CUDA out of"
              " memory\nsome trailing log line\n")
    assert tunestats.exception_line(stderr) == "torch.OutOfMemoryError: CUDA out of memory"
    assert tunestats.exception_line("ninja: no work to do\n") == ""


# ------------------------------------------------------------------------------------ where the time goes


def test_the_report_says_where_the_wall_time_went_per_phase(task, tmp_path, capsys, monkeypatch):
    from popkit.views import tuning as view

    ticks = iter(range(0, 10**6))  # every look at the clock: 1 s later
    fake = Fake()
    report = run(task, tmp_path, fake, clock=lambda: float(next(ticks)))
    phases = {p.name: p for p in report.phases}
    assert list(phases) == ["probe", "check", "race", "A/B", "final check"]  # nothing to build
    assert phases["check"].evals == 4 and phases["race"].evals == 3 and phases["final check"].evals == 1
    assert phases["A/B"].evals == fake.calls[("ab", "CHUNK=4096")] + fake.calls[("ab", "CHUNK=256")] - 1  # warmup
    assert all(p.seconds > 0 for p in report.phases)
    assert sum(p.seconds for p in report.phases) <= report.duration_s
    assert TuneReport.from_json(json.loads(json.dumps(report.to_json()))).phases == report.phases
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    view.show_tune(report)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("time: "))
    assert line.startswith("time: probe ")
    assert re.search(r" · check \d+\.\d s \(4 evals\) · race \d+\.\d s \(3 evals\) · ", line)


def test_a_second_tune_of_the_unchanged_file_builds_nothing(task, tmp_path):
    def shared(task, contents, options):
        return [Identity("b" * 64, True, ("ext",)) for _ in contents]

    def building(task, path, content, options, progress=None):  # leaves a library, as load_inline's build does
        folder = Path(options.env["TORCH_EXTENSIONS_DIR"]) / "ext"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ext.so").write_bytes(b"\x7fELF")
        fakes[-1].builds.append(str(folder))
        return CompileStep(exit_code=0, duration_s=1.0), ""

    fakes = [Fake()]
    fakes[0].backend = tune.Backend(**{**fakes[0].backend.__dict__, "identities": shared, "build": building})
    first = run(task, tmp_path / "1", fakes[0])
    assert first.builds == 1 and len(fakes[0].builds) == 1
    fakes.append(Fake())
    fakes[1].backend = tune.Backend(**{**fakes[1].backend.__dict__, "identities": shared, "build": building})
    second = run(task, tmp_path / "2", fakes[1])
    assert second.builds == 0 and fakes[1].builds == [] and second.winner_label == first.winner_label
    assert any("reused" in n for n in second.notes)
    checks = [o for o in fakes[1].options if o.label.startswith("tune CHUNK")]
    assert checks and all(o.precompile is False for o in checks)  # the evals find the library built
    (library,) = Path(fakes[0].builds[0]).glob("*.so")
    library.unlink()  # a build folder emptied since: built again
    fakes.append(Fake())
    fakes[2].backend = tune.Backend(**{**fakes[2].backend.__dict__, "identities": shared, "build": building})
    assert run(task, tmp_path / "3", fakes[2]).builds == 1


def test_the_shape_by_variant_table_and_the_gain_of_per_shape_dispatch(task, tmp_path, capsys, monkeypatch):
    from popkit.views import tuning as view

    fake = Fake({1: (900e3, 900e3), 256: (5e3, 40e3), 1000: None, 4096: (20e3, 10e3)})
    report = run(task, tmp_path, fake, settings=settings(per_shape=True))
    gain = report.dispatch_gain
    assert report.benchmarks == ("size: 4096; seed: 3", "size: 8192; seed: 4")
    assert gain.per_shape == ("CHUNK=256", "CHUNK=4096") and gain.best_single in ("CHUNK=256", "CHUNK=4096")
    # geometric means: best single sqrt(5*40)=sqrt(20*10)=14.1 µs; the fastest at each shape sqrt(5*10)=7.07 µs
    assert gain.gain == pytest.approx(2.0, rel=0.03)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["dispatch_gain"]["gain"] == pytest.approx(gain.gain) and doc["benchmarks"] == list(report.benchmarks)
    assert {v["label"]: v["shape_ns"] for v in doc["variants"]}["CHUNK=256"][0] == pytest.approx(5e3, rel=0.02)
    assert TuneReport.from_json(doc) == report
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    view.show_tune(report)
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.strip().startswith("size: 4096; seed: 3") and "µs" in line)
    assert "5.0" in row and "*" in row
    said = next(line for line in lines if line.startswith("shapes: per-shape dispatch (the fastest at each shape, *) "))
    assert float(said.split("*) ")[1].split("×")[0]) == pytest.approx(2.0, rel=0.03)
    assert said.endswith(f"faster than the best single variant, {gain.best_single}, by the race's medians")
    one = run(task, tmp_path / "one", Fake())  # 4096 fastest at both shapes: no gain
    assert one.dispatch_gain.gain == 1.0 and one.dispatch_gain.per_shape == ("CHUNK=4096", "CHUNK=4096")


# ------------------------------------------------------------------------------------ the race decides


def test_a_race_that_separates_its_finalists_decides_with_no_ab(task, tmp_path, capsys, monkeypatch):
    from popkit.views import tuning as view

    fake = Fake()
    report = run(task, tmp_path, fake, settings=settings(race_decides=True))
    v = by_label(report)
    assert report.decided_by == "race" and report.confirmed and report.winner_label == "CHUNK=4096"
    assert not [k for k in fake.calls if k[0] == "ab"]  # no A/B eval at all
    assert report.race_rounds == tunerace.LOOK_ROUNDS and len(v["CHUNK=4096"].scores_s) == tunerace.LOOK_ROUNDS
    assert v["CHUNK=4096"].faster and v["CHUNK=4096"].ratio.high < 1 and v["CHUNK=4096"].ab is None
    assert v["CHUNK=4096"].ratio.estimate == pytest.approx(0.25, rel=0.03)  # (5*10)/(20*40), geomean: 1/4
    assert len(v["CHUNK=1"].scores_s) == 1  # raced out in round 1: not timed again
    text = (tmp_path / "out.py").read_text()
    assert "# popkit tune: CHUNK=4096 chosen on " in text and "race over 4 rounds)" in text
    assert TuneReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    view.show_tune(report)
    out = capsys.readouterr().out
    assert "faster (race)" in out and "confirmed by the race's 4 rounds (no A/B needed)" in out


def test_finalists_within_the_races_noise_go_to_an_ab(task, tmp_path):
    fake = Fake({**TIMES, 4096: (20.05e3, 40.05e3)})  # within the fake's 1% noise of the input's 256
    report = run(task, tmp_path, fake, settings=settings(race_decides=True))
    assert report.decided_by == "A/B" and fake.calls[("ab", "CHUNK=4096")] > 0
    assert len(by_label(report)["CHUNK=4096"].scores_s) == tunerace.LOOK_ROUNDS


def test_early_elimination_drops_what_the_intervals_separate_beyond_the_halving(task):
    def state(i, scores):
        return tunerace.State(index=i, values={}, label=f"v{i}", path=Path("x"), content=b"", sha256=str(i),
                              outcome="passed", scores=list(scores))

    leader = state(0, [1.0, 1.01, 0.99, 1.0])
    near = state(1, [1.0, 0.995, 1.01, 1.003])
    slow = state(2, [1.5, 1.52, 1.49, 1.51])
    assert tunestats.clearly_slower(leader, [near, slow]) == [2]
    assert tunestats.race_ratio(slow, leader).low > 1 and tunestats.race_ratio(near, leader).contains(1.0)
    assert tunestats.race_ratio(state(3, [2.0]), leader) is None  # one round: no interval


# ------------------------------------------------------------------------------------ stopped, resumed


class Clocked(Fake):
    """A Fake on a clock of its own: each eval takes `each` seconds, or stops at the task's timeout (timed out)."""

    def __init__(self, each=10.0, interrupt_at=None, **kw):
        super().__init__(**kw)
        self.now, self.each, self.interrupt_at, self.benchmarks = 0.0, each, interrupt_at, 0

    def clock(self) -> float:
        return self.now

    def run(self, task, path, mode, options, progress=None, system=None, content=None):
        if mode == "benchmark":
            self.benchmarks += 1
            if self.benchmarks == self.interrupt_at:
                raise KeyboardInterrupt
        limit = task.timeout_for(mode)
        report = super().run(task, path, mode, options, progress, system, content)
        if self.each > limit:
            self.now += limit
            run = ModeRun(**{**report.runs[0].__dict__, "outcome": "timed_out", "timed_out": True, "exit_code": None})
            return RunReport(**{**report.__dict__, "runs": (run,)})
        self.now += self.each
        return report


def test_the_budget_stops_an_eval_in_flight_and_the_closing_words_say_what_happened(task, tmp_path, capsys,
                                                                                      monkeypatch):
    from popkit.views import tuning as view

    fake = Clocked()
    report = run(task, tmp_path, fake, settings=settings(budget_s=45, jobs=1), clock=fake.clock)
    assert report.stopped == "budget" and not report.output and fake.now <= 45 + 1
    assert [v.outcome for v in report.variants].count("passed") == 3 and not any(v.scores_s for v in report.variants)
    assert not any(v.outcome == "timed_out" or v.race_failure for v in report.variants)  # cut, not judged
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    view.show_tune(report)
    out = capsys.readouterr().out
    assert "no variant passed its checks" not in out
    assert ("nothing written: the time budget ran out before any of the 3 variants that passed their checks was "
            "timed") in out


def test_budget_after_a_race_round_writes_the_fastest_so_far_without_a_final_check(task, tmp_path):
    fake = Clocked()
    report = run(task, tmp_path, fake, settings=settings(budget_s=75, jobs=1), clock=fake.clock)
    assert report.stopped == "budget" and report.winner_label == "CHUNK=4096" and not report.confirmed
    assert report.final_check == "skipped" and report.exit_code == ExitCode.OK and fake.now <= 75 + 1
    assert fake.calls[("test", "tune: written file")] == 0
    assert "\nCHUNK = 4096\n" in (tmp_path / "out.py").read_text()
    assert any("the final check did not run (the time budget ran out)" in n for n in report.notes)


def test_ctrl_c_writes_the_best_so_far_and_resume_repeats_no_measured_point(task, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    first = Clocked(interrupt_at=3)  # the race's third eval: two variants timed, one not
    report = run(task, tmp_path / "1", first, settings=settings(record=True), clock=first.clock)
    assert report.stopped == "interrupted" and report.exit_code == ExitCode.INTERRUPTED
    timed = {v.label for v in report.variants if v.scores_s}
    assert len(timed) == 2 and report.output and report.winner_label == min(
        (v for v in report.variants if v.scores_s), key=lambda v: v.score_s).label
    from popkit.views import tuning as view

    view.show_tune(report)
    assert f"wrote {report.output}: {report.winner_label}: the race's fastest when tune was stopped, not confirmed" \
        in " ".join(capsys.readouterr().out.split())
    ran_before = {k for k, n in first.calls.items() if n}
    again = Clocked()
    resumed = run(task, tmp_path / "2", again, settings=settings(record=True, resume=True), clock=again.clock)
    repeated = {k for k, n in again.calls.items() if n and k[0] in ("test", "benchmark")} & ran_before
    assert repeated == set()  # no check and no race round measured before ran again
    assert again.calls[("benchmark", "tune CHUNK=1")] + again.calls[("benchmark", "tune CHUNK=4096")] + \
        again.calls[("benchmark", "tune CHUNK=256")] == 1  # the one variant the first tune had not timed
    assert resumed.winner_label == "CHUNK=4096" and resumed.exit_code == ExitCode.OK


def test_progress_says_each_phase_and_estimates_the_time_left(task, tmp_path):
    said: list[str] = []
    fake = Clocked()
    run(task, tmp_path, fake, settings=settings(jobs=1, budget_s=1000, race_decides=True), clock=fake.clock,
        progress=said.append)
    checks = [line for line in said if line.startswith("check ")]
    assert checks[0] == "check 1/4 CHUNK=1: passed, ~30 s left in this phase"  # 3 more at 10 s each
    assert checks[-1].startswith("check 4/4 ") and "left" not in checks[-1]
    estimate = next(line for line in said if line.startswith("estimate: race about "))
    assert "at ~10 s an eval" in estimate and estimate.endswith("s of the budget left")
    assert any(line.startswith("race round 2: 2 variant(s), toward the race's look at round 4, ~") for line in said)


def test_tune_sizes_a_gpu_task_on_a_cpu_as_bench_does(task, monkeypatch):
    """One CPU sizing for every command that takes --allow-cpu: tune races the shapes bench would keep here."""
    from dataclasses import replace

    from popkit.measure import sizing
    from popkit.submission.source import Source

    seen = []

    def fit(task_, source, request, executor, progress):
        seen.append((request.mode, request.allow_cpu))
        return replace(task_, benchmarks=task_.benchmarks[:1]), ("size: 999",)

    monkeypatch.setattr(sizing, "fit", fit)
    fitted, notes = tune.sized_task(task, Source.read(SUBMISSION), runner.RunOptions(), True)
    assert seen == [("benchmark", True)] and len(fitted.benchmarks) == 1
    assert notes and "size: 999" in notes[0] and "not leaderboard-faithful" in notes[0]


# ------------------------------------------------------------------------------------- warm race evals


class _Pair:
    """A stand-in warm pair: what Ahead asks of one."""

    def __init__(self, key, log):
        self.key, self.log, self.session = key, log, self
        log.append(("start", key))

    def go(self, content, progress):
        self.log.append(("go", self.key))
        return type("Result", (), {"runs": (content,)})()

    def report(self, runs, started=None, t0=None):
        return runs

    def discard(self):
        self.log.append(("discard", self.key))


def test_ahead_starts_its_pairs_a_batch_at_a_time_and_ends_what_it_did_not_use():
    """A start-up holds the GPU shared and a `go` exclusively, so pairs start together, once the last batch is used."""
    from popkit.run import warm

    log: list = []
    with warm.Ahead(lambda key: _Pair(key, log), depth=2) as pairs:
        for i, key in enumerate("abc"):
            pairs.refill(list("abcd"[i:]))
            assert pairs.run(key, key.encode(), lambda _m: None) == (key.encode(),)
    assert log == [("start", "a"), ("start", "b"), ("go", "a"), ("discard", "a"), ("go", "b"), ("discard", "b"),
                   ("start", "c"), ("start", "d"), ("go", "c"), ("discard", "c"), ("discard", "d")]


def test_warm_race_evals_need_cpus_for_start_ups_side_by_side():
    assert [ahead.ahead_depth(n) for n in (1, 2, 7, 8, 12, 16, 128)] == [0, 0, 0, 2, 3, 4, 4]


@pytest.mark.slow
def test_a_tune_given_one_gpu_races_through_warm_pairs_on_that_gpu(tmp_path, monkeypatch):
    """One GPU named (`--devices 3`): the race stays warm, and each warm pair's eval sees only that GPU, as tune's
    cold evals do; two GPUs: cold evals spread over them."""
    from popkit.run import warm

    monkeypatch.setattr(ahead, "ahead_depth", lambda cpus=None: 2)
    seen = []
    real_go = warm.WarmPair.go
    monkeypatch.setattr(warm.WarmPair, "go", lambda self, *a, **k: seen.append(
        self.options.env.get("CUDA_VISIBLE_DEVICES")) or real_go(self, *a, **k))
    report = tune.run_tune(load_task(TASK_DIR), SUBMISSION, tmp_path / "out.py", runner.RunOptions(harness="popkit"),
                           tune.TuneSettings(confirm=1, record=False, per_shape=False), devices=("3",))
    race = next(p for p in report.phases if p.name == "race")
    assert report.race_evals == "warm, 2 ahead" and seen and set(seen) == {"3"} and len(seen) == race.evals
    two = tune.run_tune(load_task(TASK_DIR), SUBMISSION, tmp_path / "two.py", runner.RunOptions(harness="popkit"),
                        tune.TuneSettings(confirm=1, record=False, per_shape=False), devices=("3", "4"))
    assert two.race_evals.startswith("cold: its evals run on several GPUs") and len(seen) == race.evals


@pytest.mark.slow
def test_race_evals_through_warm_pairs_time_and_pick_as_cold_evals_do(tmp_path, monkeypatch):
    """Every race eval goes through a warm pair (the checks and the final check stay cold), and the race picks
    the variant cold evals pick: the fixture's fastest by 3x or more. The warm run's winner must be it too; the
    cold run's final word, after its A/B against the input's values, is not compared (on a loaded CI machine a
    cold run once ended on the input's CHUNK=256, and the assertion then said too little to tell why)."""
    from popkit.run import warm

    monkeypatch.setattr(ahead, "ahead_depth", lambda cpus=None: 2)
    gone = []
    real_go = warm.WarmPair.go
    monkeypatch.setattr(warm.WarmPair, "go", lambda self, *a, **k: gone.append(self.mode) or real_go(self, *a, **k))
    report = tune.run_tune(load_task(TASK_DIR), SUBMISSION, tmp_path / "out.py", runner.RunOptions(harness="popkit"),
                           tune.TuneSettings(confirm=1, record=False, per_shape=False))
    race = next(p for p in report.phases if p.name == "race")
    assert gone and set(gone) == {"benchmark"} and len(gone) == race.evals
    assert report.winner_label == "CHUNK=4096"
    assert all(len(v.rounds) >= 1 for v in report.variants if v.label in ("CHUNK=256", "CHUNK=4096"))
    cold = tune.run_tune(load_task(TASK_DIR), SUBMISSION, tmp_path / "cold.py", runner.RunOptions(harness="popkit"),
                         tune.TuneSettings(confirm=1, record=False, per_shape=False, warm_race=False))
    assert len(gone) == race.evals

    def finalists(r: TuneReport) -> list[str]:  # what the race picked, before the A/B against the input's values
        return [v.label for v in r.variants if v.outcome == "passed" and not v.race_failure and v.left_after is None]

    assert finalists(cold) == finalists(report) == ["CHUNK=4096"], (  # what each run saw, should a flip happen
        [(r.winner_label, r.decided_by, r.notes, [(v.label, v.outcome, v.race_failure, v.left_after, v.scores_s)
                                                  for v in r.variants]) for r in (report, cold)])
