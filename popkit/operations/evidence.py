"""Evidence of a run that anyone can re-check: `bench --evidence OUT` writes it, `popkit verify OUT` re-runs it.

One JSON file (schema popkit/evidence/1): the submission's bytes (base64) and sha256, each task file's sha256
(and each file of popkit's harness where it judged), popkit's version, the machine (GPU, driver, clocks, torch,
CUDA), the run's options and secret seeds, the whole RunReport (every case's verdict, raw samples where the
harness keeps them, the score), and `digest`, the sha256 of everything else in canonical JSON. The digest catches
a file changed after it was written (an edit, a truncation); it is no signature: whoever rewrites the content can
write a new digest, which is why verify re-runs the bytes.

verify refuses before running when the file was tampered with (exit 1, naming what), when this machine's GPU is
not the recorded one (exit 11) and when the task's files or popkit's harness differ (exit 3); then it runs the
same bytes the same way here and compares each timed shape with the A/B's statistics (popkit.measure.shapes): a
shape reproduces when the ratio here / recorded has a 95% interval that spans 1 or lies within the tolerance
(default 5%) of it, or the ratio of its medians does (a host stall moves a mean, rarely a median), and every
case's verdict is the one recorded. Leaderboard-mode shapes are compared by verdict alone: their times (fresh
inputs and a check between calls) varied between two runs of one file on one quiet H100 by 0.83x to 2.44x
(medians, 2026-11-28), while benchmark-mode medians agreed within 2.5%.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from popkit import __version__, resources
from popkit.errors import EnvironmentProblem, ExitCode, PopkitError, TaskError, UsageError
from popkit.machine import nvml
from popkit.measure import shapes
from popkit.model.results import CaseResult, RunReport
from popkit.model.stats import median
from popkit.model.tasks import SUBMISSION_SOURCE, Task
from popkit.operations import workflows
from popkit.run import sandbox
from popkit.run.runner import RunOptions
from popkit.submission.source import Source

SCHEMA = "popkit/evidence/1"
DEFAULT_TOLERANCE = 0.05  # a shape whose ratio is known to lie within 5% of 1 reproduces
REPRODUCES, SAME_VERDICT = "reproduces", "same verdict"  # the statuses that pass (ShapeCheck)
MAX_EVIDENCE_BYTES = 256 * 1024 * 1024


def digest_of(document: Mapping[str, Any]) -> str:
    """sha256 of the document without its `digest`, as canonical JSON (sorted keys, no spaces)."""
    body = {k: v for k, v in document.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def task_hashes(task: Task) -> dict[str, str]:
    """sha256 of each file the task hands the eval (the submission's slot left out), by its name there."""
    return {f.name: hashlib.sha256((task.path / f.source).read_bytes()).hexdigest()
            for f in task.files if f.source != SUBMISSION_SOURCE}


def harness_files(harness: str) -> dict[str, str]:
    """sha256 of each file of popkit's harness, by name, when it judges the run (`harness` popkit); else {}. A
    bundled task lists them among its own files; a public task run under popkit's harness does not."""
    if harness != "popkit":
        return {}
    return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in resources.harness_paths().items()}


def clocks() -> dict[str, str] | None:
    """The GPU's current and maximum SM and memory clocks (MHz) from nvidia-smi; None where it cannot say."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    fields = ("clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem")
    try:
        done = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")] if done.stdout.strip() else []
    return dict(zip(fields, values)) if done.returncode == 0 and len(values) == len(fields) else None


def machine(report: RunReport) -> dict[str, Any]:
    probe = dict(report.system or {})
    return {"gpu": probe.get("device"), "arch": probe.get("arch"), "gpu_count": probe.get("gpu_count"),
            "driver": nvml.system_driver_version(), "clocks": clocks(), "torch": probe.get("torch"),
            "cuda": probe.get("cuda"), "hip": probe.get("hip"), "python": probe.get("python"),
            "platform": probe.get("platform")}


def document(outcome: workflows.RunOutcome, request: workflows.Request) -> dict[str, Any]:
    """The evidence of one finished run (see the module doc), digest included."""
    source = request.sources[0]
    report = outcome.report
    doc = {
        "schema": SCHEMA, "popkit": __version__, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "submission": {"name": source.path.name, "sha256": hashlib.sha256(source.content).hexdigest(),
                       "bytes_b64": base64.b64encode(source.content).decode()},
        "task": {"name": outcome.task.name, "leaderboard": report.leaderboard, "files": task_hashes(outcome.task),
                 "harness_files": harness_files(request.options.harness)},
        "machine": machine(report),
        "run": {"mode": request.mode, "harness": request.options.harness, "allow_cpu": request.allow_cpu,
                "secret_seeds": list(report.secret_seeds), "world_size": request.options.world_size},
        "score_s": report.score_public_s, "outcome": report.outcome,
        "report": report.to_json(),
    }
    doc = json.loads(json.dumps(doc, default=str))  # the digest covers exactly what the file will hold
    doc["digest"] = digest_of(doc)
    return doc


def write(outcome: workflows.RunOutcome, request: workflows.Request, path: Path) -> Path:
    """Write the evidence to `path` whole or not at all (a temporary file beside it, then renamed)."""
    data = json.dumps(document(outcome, request), indent=1, sort_keys=True) + "\n"
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the evidence ({exc.strerror or exc})",
                         "give --evidence a path in a folder you can write") from None
    return path


@dataclass(frozen=True)
class ShapeCheck:
    key: str  # `benchmark: size: 1024; seed: 3211` (`secret` after the mode for a secret run)
    # reproduces, same verdict (leaderboard mode: times not compared), differs, missing (timed on one side
    # only), verdict (pass/fail differs)
    status: str
    comparison: shapes.ShapeComparison | None = None
    note: str = ""

    def to_json(self) -> dict:
        return {"key": self.key, "status": self.status, "note": self.note,
                "comparison": self.comparison.to_json() if self.comparison else None}


@dataclass(frozen=True)
class VerifyReport:
    evidence: str
    task: str
    recorded_gpu: str | None
    here_gpu: str | None
    tolerance: float
    shapes: tuple[ShapeCheck, ...]
    recorded_score_s: float | None
    here_score_s: float | None
    notes: tuple[str, ...] = ()

    @property
    def reproduces(self) -> bool:
        return any(s.status == REPRODUCES for s in self.shapes) and all(
            s.status in (REPRODUCES, SAME_VERDICT) for s in self.shapes)

    @property
    def exit_code(self) -> int:
        return int(ExitCode.OK if self.reproduces else ExitCode.FAILED)

    def to_json(self) -> dict:
        return {"evidence": self.evidence, "task": self.task, "recorded_gpu": self.recorded_gpu,
                "here_gpu": self.here_gpu, "tolerance": self.tolerance, "reproduces": self.reproduces,
                "recorded_score_s": self.recorded_score_s, "here_score_s": self.here_score_s,
                "shapes": [s.to_json() for s in self.shapes], "notes": list(self.notes)}


def read(path: Path) -> tuple[dict[str, Any], bytes]:
    """The evidence document and the submission's bytes; PopkitError (exit 1) naming what was tampered with."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_EVIDENCE_BYTES:
            raise UsageError(f"{path}: over {MAX_EVIDENCE_BYTES >> 20} MiB: not evidence popkit wrote", "")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", "give the file bench --evidence wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PopkitError(f"{path}: not readable as evidence ({exc})", "give the file bench --evidence wrote",
                          exit_code=ExitCode.FAILED) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise PopkitError(f"{path}: not popkit evidence (schema {doc.get('schema') if isinstance(doc, dict) else '?'})",
                          f"popkit verify reads files with schema {SCHEMA}", exit_code=ExitCode.FAILED)
    if doc.get("digest") != digest_of(doc):
        raise PopkitError(f"{path}: digest mismatch: the content was changed after popkit wrote it",
                          "verify only the file as bench --evidence wrote it", exit_code=ExitCode.FAILED)
    sub = doc.get("submission") or {}
    try:
        content = base64.b64decode(sub.get("bytes_b64", ""), validate=True)
    except ValueError:
        content = b""
    if hashlib.sha256(content).hexdigest() != sub.get("sha256"):
        raise PopkitError(f"{path}: the submission's bytes do not match their sha256",
                          "the file was tampered with; verify only the file as written", exit_code=ExitCode.FAILED)
    return doc, content


def timed_cases(report: RunReport) -> dict[str, list[CaseResult]]:
    """Every timed case of the ranked modes by `mode[ secret]: spec`, in the report's order."""
    found: dict[str, list[CaseResult]] = {}
    for run in report.runs:
        if run.mode in ("benchmark", "leaderboard"):
            for case in run.benchmarks:
                found.setdefault(f"{run.mode}{' secret' if run.secret else ''}: {case.spec}", []).append(case)
    return found


def compare(recorded: RunReport, here: RunReport, tolerance: float) -> tuple[ShapeCheck, ...]:
    a, b = timed_cases(recorded), timed_cases(here)
    checks = []
    for key in list(a) + [k for k in b if k not in a]:
        if key not in a or key not in b:
            where = "here only" if key in b else "in the evidence only"
            checks.append(ShapeCheck(key, "missing", note=f"timed {where}"))
            continue
        if [c.passed for c in a[key]] != [c.passed for c in b[key]]:
            checks.append(ShapeCheck(key, "verdict", note="passed " + ("there, failed here" if a[key][0].passed
                                                                     else "here, failed there")))
            continue
        found = shapes.compare_shapes({key: a[key]}, {key: b[key]}, "recorded", "here").shapes
        if not found:
            checks.append(ShapeCheck(key, "missing", note="no timing on one side"))
            continue
        shape = found[0]
        ratio, medians = shape.ratio, median_ratio(shape)
        note = f"here / recorded = {ratio.estimate:.3f}" + (f", medians {medians:.3f}" if medians else "")
        if key.startswith("leaderboard"):
            checks.append(ShapeCheck(key, SAME_VERDICT, shape, f"{note}; leaderboard-mode times are not compared"))
            continue
        bounds = (1 / (1 + tolerance), 1 + tolerance)
        within = ratio.defined and bounds[0] <= ratio.low and ratio.high <= bounds[1]  # type: ignore[operator]
        same = shape.verdict == shapes.SAME or within or (medians is not None and bounds[0] <= medians <= bounds[1])
        checks.append(ShapeCheck(key, REPRODUCES if same else "differs", shape, note))
    return tuple(checks)


def median_ratio(shape: shapes.ShapeComparison) -> float | None:
    """The median of the timed calls here over the recorded one's, where both sides kept samples."""
    if not shape.a_samples_ns or not shape.b_samples_ns:
        return None
    return median(shape.b_samples_ns) / median(shape.a_samples_ns)


def verify(path: Path, *, tolerance: float = DEFAULT_TOLERANCE, task: str | None = None, roots=(),
           python: str | None = None, progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Check the evidence file, refuse what cannot be compared, re-run its bytes here and compare (module doc).
    `task`: the task to run (default the recorded task's name, looked up as popkit test does)."""
    doc, content = read(path)
    recorded = RunReport.from_json(doc["report"])
    found = workflows.resolve(Source(Path(doc["submission"]["name"]), content), task or doc["task"]["name"], roots)
    here_files = task_hashes(found.task)
    differing = sorted(k for k in set(here_files) | set(doc["task"]["files"])
                       if here_files.get(k) != doc["task"]["files"].get(k))
    if differing:
        raise TaskError(f"{path}: the task's files here differ from the recorded ones: {', '.join(differing)}",
                        "verify with the task files the evidence was made with (--task DIR)")
    recorded_harness = doc["task"].get("harness_files") or {}
    here_harness = harness_files("popkit") if recorded_harness else {}
    changed = sorted(k for k in set(here_harness) | set(recorded_harness)
                     if here_harness.get(k) != recorded_harness.get(k))
    if changed:
        raise TaskError(f"{path}: popkit's harness here differs from the one that judged the run: {', '.join(changed)}",
                        f"verify with the popkit that wrote it ({doc.get('popkit')})")
    options = RunOptions(harness=doc["run"]["harness"], secret_seeds=tuple(doc["run"]["secret_seeds"]),
                         world_size=doc["run"].get("world_size"), **({"python": python} if python else {}))
    probe = sandbox.probe(options.python, isolation=options.isolation)
    recorded_gpu, here_gpu = doc["machine"].get("gpu"), probe.get("device")
    if recorded_gpu != here_gpu:
        raise EnvironmentProblem(f"{path}: recorded on {recorded_gpu}, this machine has {here_gpu}: the timings "
                                 "cannot be compared", f"verify on a machine with {recorded_gpu}")
    notes = [f"{key} differs: recorded {doc['machine'].get(key)}, here {probe.get(key)}"
             for key in ("torch", "cuda", "hip") if doc["machine"].get(key) != probe.get(key)]
    with tempfile.TemporaryDirectory(prefix="popkit-verify-") as tmp:
        sub = Path(tmp) / doc["submission"]["name"]
        sub.write_bytes(content)
        request = workflows.Request((Source(sub, content),), doc["run"]["mode"], str(found.task.path), tuple(roots),
                                    options, allow_cpu=doc["run"].get("allow_cpu", False), record=False)
        outcome = workflows.run(request, progress=progress)
    here = replace(outcome.report, submission=doc["submission"]["name"])
    for name, report in (("the recorded run", recorded), ("this run", here)):
        if report.skipped_shapes:
            notes.append(f"{name} left out {len(report.skipped_shapes)} benchmark shape(s) that do not fit the timeout "
                         "on a CPU (--allow-cpu sizing): a shape timed on one side only is missing")
    return VerifyReport(str(path), found.task.name, recorded_gpu, here_gpu, tolerance,
                        compare(recorded, here, tolerance), recorded.score_public_s, here.score_public_s, tuple(notes))
