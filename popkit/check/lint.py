"""`popkit check`: what the leaderboard server refuses (docs/protocol-notes.md §6), plus reward-hack rules.

Server rules are textual where the server is textual (size, encoding, the word `stream`); the
directive rules use popkit.model.directives, which reads directives both as the server and as
popcorn-cli do. Reward-hack rules read the Python syntax tree (popkit.check.hacks), so a comment
or a string that merely mentions `synchronize` is no finding. Errors block a submission; warnings
inform.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit.check.hacks import hack_findings
from popkit.check.precompile import predict_file
from popkit.check.rules import EXTENSIONS, MAX_BYTES, RULES, finding
from popkit.errors import SubmissionError
from popkit.model import leaderboards
from popkit.model.diagnostics import ERROR, WARNING, Diagnostic
from popkit.model.directives import cli_directives, server_directives
from popkit.model.leaderboards import Standing
from popkit.model.tasks import MODES, bundled_problem_set, load_task, problem_sets
from popkit.model.tunespec import declared as tune_declared, parse as parse_tune

CHECK_SCHEMA = "popkit/check/1"
GUARD_TIMEOUT_S = 60.0

_STREAM = re.compile("stream", re.IGNORECASE)
_POPCORN_FD = re.compile("POPCORN_FD")


@dataclass(frozen=True)
class GuardPattern:
    pattern: str
    severity: str
    evidence: str


@dataclass(frozen=True)
class GuardVerdict:
    """KernelGuard's classification (valid, suspicious, hacked, ...) and the patterns it matched."""

    classification: str
    should_filter: bool
    patterns: tuple[GuardPattern, ...] = ()
    via: str = "module"  # "module" (imported) or "cli" (the kernelguard executable)
    error: str = ""  # set when KernelGuard was found but failed

    def to_json(self) -> dict:
        return {"classification": self.classification, "should_filter": self.should_filter,
                "patterns": [asdict(p) for p in self.patterns], "via": self.via, "error": self.error}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GuardVerdict":
        return cls(classification=data["classification"], should_filter=data["should_filter"],
                   patterns=tuple(GuardPattern(**p) for p in data.get("patterns", ())),
                   via=data.get("via", "module"), error=data.get("error", ""))


@dataclass(frozen=True)
class LintReport:
    """Everything `popkit check` found in one file, with what it resolved the target to."""

    path: str
    sha256: str  # of the exact bytes checked
    size_bytes: int
    leaderboard: str | None  # as popcorn-cli would send it (flag, else directive)
    gpu: str | None
    mode: str | None
    offered_gpus: tuple[str, ...] | None = None  # None: the leaderboard's problem set is not known locally
    findings: tuple[Diagnostic, ...] = ()
    guard: GuardVerdict | None = None
    # the leaderboard's compile path for a Python file (check.precompile's prediction, as JSON); None otherwise
    precompile: Mapping[str, Any] | None = None
    schema: str = CHECK_SCHEMA

    @property
    def errors(self) -> list[Diagnostic]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict:
        data = asdict(self)
        data["offered_gpus"] = list(self.offered_gpus) if self.offered_gpus is not None else None
        data["findings"] = [f.to_json() for f in self.findings]
        data["guard"] = self.guard.to_json() if self.guard else None
        data["ok"] = self.ok
        if self.precompile is None:
            del data["precompile"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LintReport":
        offered = data.get("offered_gpus")
        return cls(path=data["path"], sha256=data["sha256"], size_bytes=data["size_bytes"],
                   leaderboard=data.get("leaderboard"), gpu=data.get("gpu"), mode=data.get("mode"),
                   offered_gpus=tuple(offered) if offered is not None else None,
                   findings=tuple(Diagnostic.from_json(f) for f in data.get("findings", ())),
                   guard=GuardVerdict.from_json(data["guard"]) if data.get("guard") else None,
                   precompile=data.get("precompile"),
                   schema=data.get("schema", CHECK_SCHEMA))


# ----------------------------------------------------------------------------------- server rules


def _file_findings(content: bytes, name: str) -> tuple[list[Diagnostic], str | None]:
    """Size, emptiness, encoding, extension; returns the decoded text when it is UTF-8."""
    found = []
    suffix = Path(name).suffix.lower()
    if suffix not in EXTENSIONS:
        found.append(finding("extension", ERROR, None, None,
                             f"extension `{suffix or '(none)'}` is refused by the server",
                             "allowed: " + ", ".join(EXTENSIONS)))
    if len(content) > MAX_BYTES:
        found.append(finding("size", ERROR, None, None,
                             f"{len(content):,} bytes is over the server's limit of {MAX_BYTES:,}",
                             "move generated tables or embedded binaries out of the file"))
    if not content.strip():
        found.append(finding("empty", ERROR, None, None, "the file is empty",
                             "write a custom_kernel(data) function in it"))
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content[:exc.start].count(b"\n") + 1
        column = exc.start - (content.rfind(b"\n", 0, exc.start) + 1) + 1
        found.append(finding("utf8", ERROR, line, column, f"not UTF-8 (byte {exc.start}: "
                             f"0x{content[exc.start]:02x})", "save the file as UTF-8"))
        return found, None
    if text.startswith("\ufeff"):
        found.append(finding("bom", WARNING, 1, 1,
                             "the file starts with a UTF-8 byte-order mark (BOM): Python skips it, but the server"
                             " and popcorn-cli read it as part of line 1, so no `#!POPCORN` directive there counts",
                             "save the file as UTF-8 without a BOM"))
    return found, text


def _stream_findings(text: str) -> list[Diagnostic]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _STREAM.finditer(line):
            found.append(finding(
                "stream", ERROR, number, match.start() + 1,
                f"the server refuses any file containing `stream` (case-insensitive, comments included):"
                f" `{match.group(0)}`",
                "rename it or drop it; work on the default stream (the harness synchronizes around it)"))
    return found


def _first_token(value: str) -> tuple[str, bool]:
    """popcorn-cli submits to one GPU: the first of several names. Returns (name, several)."""
    parts = [p for p in re.split(r"[\s,]+", value.strip()) if p]
    return (parts[0] if parts else value), len(parts) > 1


def _directive_findings(text: str, leaderboard: str | None, gpu: str | None
                        ) -> tuple[list[Diagnostic], str | None, str | None]:
    """Directive rules; returns findings and the leaderboard and GPU popcorn-cli would send."""
    found: list[Diagnostic] = []
    server, client = server_directives(text), cli_directives(text)
    for problem in server.problems:
        found.append(finding("directive", ERROR, problem.line, 1, problem.message,
                             "directives: `#!POPCORN leaderboard NAME` and `#!POPCORN gpu NAME`, once each"))
    for key, srv_value, srv_line, cli_value, cli_line in (
        ("leaderboard", server.leaderboard, server.leaderboard_line, client.leaderboard, client.leaderboard_line),
        ("gpu", server.gpu, server.gpu_line, client.gpu, client.gpu_line),
    ):
        if cli_value is None or cli_line == srv_line:
            continue
        if srv_value is None:
            found.append(finding("directive-outside-block", WARNING, cli_line, 1,
                                 f"`{key}` directive outside the leading comment block: popcorn-cli uses it,"
                                 " the server ignores it",
                                 "move it into the comment lines at the top of the file (no blank line before)"))
        elif cli_value != srv_value:
            found.append(finding("directive-conflict", ERROR, cli_line, 1,
                                 f"`{key}` directive says `{cli_value}` but the one on line {srv_line} says"
                                 f" `{srv_value}`: popcorn-cli sends the last, the server reads the first",
                                 "keep one directive of each kind"))

    target_lb = leaderboard or client.leaderboard
    if target_lb and target_lb != target_lb.lower():
        line = None if leaderboard else client.leaderboard_line
        found.append(finding("leaderboard-case", ERROR, line, 1 if line else None,
                             f"leaderboard `{target_lb}` has uppercase letters: popcorn-cli lowercases the name"
                             f" it sends (`{target_lb.lower()}`), and the server wants the directive to match"
                             " exactly",
                             f"write it lowercase: `{target_lb.lower()}`"))
    if leaderboard and server.leaderboard and server.leaderboard != leaderboard.lower():
        found.append(finding("leaderboard-mismatch", ERROR, server.leaderboard_line, 1,
                             f"the directive names leaderboard `{server.leaderboard}` but the submission goes to"
                             f" `{leaderboard.lower()}`: the server refuses the mismatch",
                             "drop --leaderboard or change the directive"))

    target_gpu = gpu or client.gpu
    if target_gpu:
        target_gpu, several = _first_token(target_gpu)
        if several and not gpu:
            found.append(finding("gpu-several", WARNING, client.gpu_line, 1,
                                 f"several GPUs named; popcorn-cli submits to one: `{target_gpu}`",
                                 "pass --gpu to choose, or name one GPU in the directive"))
    return found, (target_lb.lower() if target_lb else None), target_gpu


def offered_gpus_for(leaderboard: str | None, roots: Sequence[Path] = ()) -> tuple[str, ...] | None:
    """GPUs the leaderboard offers when a known problem set (or its task.yml) names them; else None."""
    if not leaderboard:
        return None

    sets = []
    for load in (lambda: problem_sets(roots), lambda: [bundled_problem_set()]):
        try:
            sets += load()
        except Exception:  # an unreadable problem set elsewhere must not stop a check of this file
            continue
    for pset in sets:
        for problem in pset.problems:
            if problem.name == leaderboard:
                if problem.gpus:
                    return tuple(problem.gpus)
                try:
                    gpus = load_task(pset.task_dir(problem)).gpus
                except Exception:
                    return None
                return tuple(gpus) or None
    return None


def _target_findings(leaderboard: str | None, gpu: str | None, mode: str | None,
                     offered: tuple[str, ...] | None) -> list[Diagnostic]:
    found = []
    if mode is not None and mode not in MODES:
        found.append(finding("mode", ERROR, None, None, f"mode `{mode}` is refused by the server",
                             "modes: " + ", ".join(MODES)))
    if gpu and offered is not None and gpu not in offered:
        close = [g for g in offered if g.lower() == gpu.lower()]
        hint = f"did you mean `{close[0]}`?" if close else "offered: " + ", ".join(offered)
        found.append(finding("gpu-not-offered", ERROR, None, None,
                             f"GPU `{gpu}` is not offered for leaderboard `{leaderboard}`", hint))
    return found


def _standing_findings(board: Standing | None, roots: Sequence[Path]) -> list[Diagnostic]:
    """A closed leaderboard is an error, a practice task a warning (leaderboards.advice's words); an unknown one an
    error where `roots` give problem sets that do not name it, a warning where none is given (popkit cannot tell)."""
    if board is None or board.state == leaderboards.OPEN:
        return []
    message, hint = leaderboards.advice(board, roots)
    if board.state == leaderboards.CLOSED:
        return [finding("leaderboard-closed", ERROR, None, None, message, hint)]
    if board.state == leaderboards.PRACTICE:
        return [finding("practice-task", WARNING, None, None, message, hint)]
    return [finding("leaderboard-unknown", ERROR if roots else WARNING, None, None, message, hint)]


def _fd_findings(text: str) -> list[Diagnostic]:
    """POPCORN_FD is the harness's result pipe; no kernel has a reason to name it."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _POPCORN_FD.finditer(line):
            found.append(finding("result-fd", ERROR, number, match.start() + 1,
                                 "names POPCORN_FD, the harness's result pipe",
                                 "a submission must never read or write the result pipe"))
    return found


def _tune_findings(text: str, name: str) -> list[Diagnostic]:
    """`#!POPKIT tune` lines are comments to the server (it reads only `#!POPCORN` directives), so a wrong one
    is a warning: `popkit tune` would refuse the file, the leaderboard would not."""
    if not tune_declared(text):
        return []
    try:
        parse_tune(text, name)
    except SubmissionError as exc:
        if "syntax error" in exc.message:
            return []  # the file's syntax is reported by the rules that need it, not as a tune problem
        match = re.match(rf"^{re.escape(name)}:(\d+): (.*)$", exc.message)
        line, message = (int(match.group(1)), match.group(2)) if match else (None, exc.message)
        return [finding("popkit-tune", WARNING, line, 1 if line else None, f"`popkit tune` refuses it: {message}",
                        exc.hint)]
    return []


# ---------------------------------------------------------------------------------- KernelGuard


def _verdict(result: Mapping[str, Any], via: str) -> GuardVerdict:
    patterns = tuple(GuardPattern(str(p.get("pattern", "?")), str(p.get("severity", "")),
                                  str(p.get("evidence", "")))
                     for p in result.get("matched_patterns") or () if isinstance(p, Mapping))
    return GuardVerdict(classification=str(result.get("classification", "unknown")),
                        should_filter=bool(result.get("should_filter")), patterns=patterns, via=via)


def run_kernelguard(text: str) -> GuardVerdict | None:
    """KernelGuard's verdict when it is installed (module first, else its CLI); None when absent.

    API (kernelguard 0.3): `kernelguard.analyze_code(code, metadata, compute_structural_hash=...)`
    returns {classification, should_filter, matched_patterns: [{pattern, severity, evidence}], ...};
    `kernelguard --api-mode < FILE` prints the same JSON.
    """
    try:
        import kernelguard  # type: ignore[import-not-found]
    except ImportError:
        kernelguard = None
    if kernelguard is not None and hasattr(kernelguard, "analyze_code"):
        try:
            return _verdict(kernelguard.analyze_code(text, None, compute_structural_hash=False), "module")
        except Exception as exc:  # a crash in an optional analyser is reported, not raised
            return GuardVerdict("error", False, via="module", error=f"{type(exc).__name__}: {exc}")
    exe = shutil.which("kernelguard") or shutil.which("kguard")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--api-mode"], input=text, capture_output=True, text=True,
                              timeout=GUARD_TIMEOUT_S)
        return _verdict(json.loads(proc.stdout), "cli")
    except subprocess.TimeoutExpired:
        return GuardVerdict("error", False, via="cli", error=f"timed out after {GUARD_TIMEOUT_S:.0f} s")
    except (OSError, ValueError, AttributeError) as exc:
        return GuardVerdict("error", False, via="cli", error=f"{type(exc).__name__}: {exc}")


def _guard_findings(verdict: GuardVerdict | None) -> list[Diagnostic]:
    if verdict is None or verdict.error or verdict.classification in ("valid", "default_reference"):
        return []
    names = ", ".join(sorted({p.pattern for p in verdict.patterns})) or verdict.classification
    if verdict.should_filter:
        return [finding("kernelguard", ERROR, None, None,
                        f"KernelGuard classifies this file as `{verdict.classification}` ({names}):"
                        " the leaderboard marks such a submission hacked and does not rank it",
                        "see the patterns below; `kernelguard --api-mode < FILE` shows the evidence")]
    return [finding("kernelguard", WARNING, None, None,
                    f"KernelGuard classifies this file as `{verdict.classification}` ({names})",
                    "reviewers look at such submissions; make sure the timed call does all the work")]


# ----------------------------------------------------------------------------------------- entry


def check_bytes(content: bytes, name: str, *, leaderboard: str | None = None, gpu: str | None = None,
                mode: str | None = None, offered_gpus: tuple[str, ...] | None = None,
                resolve_gpus: bool = False, roots: Sequence[Path] = (), guard: bool = True,
                path: str | None = None, standing: Standing | Mapping[str, str] | None = None) -> LintReport:
    """Every rule on `content` (the file's bytes, named `name` for its extension).

    `leaderboard`/`gpu` are the --leaderboard/--gpu flags; without them the directives decide, as
    in popcorn-cli. With `resolve_gpus` the leaderboard's GPU list and `standing` (open, closed, practice,
    unknown: leaderboards.lookup) come from known problem sets.
    """
    findings, text = _file_findings(content, name)
    target_lb, target_gpu = leaderboard.lower() if leaderboard else None, gpu
    verdict = None
    if text is not None:
        findings += _stream_findings(text)
        directive_found, target_lb, target_gpu = _directive_findings(text, leaderboard, gpu)
        findings += directive_found
        if Path(name).suffix.lower() != ".py":
            findings += _fd_findings(text)  # Python files: the syntax tree finds it in code, not in prose
        else:
            findings += allowed(hack_findings(text, name), text) + _tune_findings(text, name)
            if guard:
                verdict = run_kernelguard(text)
                findings += _guard_findings(verdict)
    if resolve_gpus and offered_gpus is None:
        offered_gpus = offered_gpus_for(target_lb, roots)
    if resolve_gpus and standing is None and target_lb:
        standing = leaderboards.lookup(target_lb, roots)
    if isinstance(standing, Mapping):
        standing = Standing(**standing)
    findings += _target_findings(target_lb, target_gpu, mode, offered_gpus) + _standing_findings(standing, roots)
    findings.sort(key=lambda f: (f.severity != ERROR, f.line or 0, f.column or 0, f.rule))
    return LintReport(path=path or name, sha256=hashlib.sha256(content).hexdigest(), size_bytes=len(content),
                      leaderboard=target_lb, gpu=target_gpu, mode=mode, offered_gpus=offered_gpus,
                      findings=tuple(findings), guard=verdict)


# `# popkit: allow RULE -- why`: on a finding's line (or the line above), says why an honest kernel needs what a
# reach rule finds. The finding stays, as a warning that quotes the reason; without a reason it stays an error.
_ALLOW = re.compile(r"#\s*popkit:\s*allow\s+([a-z0-9-]+)\s+--\s*(\S.*?)\s*$")
ALLOWABLE = ("sys-modules", "frame-walk")  # rules about reaching the harness; tampering itself is never allowed


def allowed(findings: list[Diagnostic], text: str) -> list[Diagnostic]:
    """`findings` with each ALLOWABLE error that a `# popkit: allow RULE -- why` comment explains made a warning."""
    lines = text.splitlines()
    reasons: dict[tuple[int, str], str] = {}
    for number, line in enumerate(lines, 1):
        match = _ALLOW.search(line)
        if match:
            reasons[(number, match[1])] = reasons[(number + 1, match[1])] = match[2]
    out = []
    for f in findings:
        reason = reasons.get((f.line or 0, f.rule)) if f.severity == ERROR and f.rule in ALLOWABLE else None
        out.append(replace(f, severity=WARNING, message=f"{f.message} (allowed: {reason})") if reason else f)
    return out


def read_bytes(path: Path | str) -> bytes:
    """A submission's bytes; a folder, a device or a pipe is refused before anything reads it (exit 4)."""
    path = Path(path)
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise SubmissionError(f"{path}: {what}", "check the path of your submission")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SubmissionError(f"{path}: cannot read ({exc.strerror or exc})") from None


def check_file(path: Path | str, *, leaderboard: str | None = None, gpu: str | None = None,
               mode: str | None = None, roots: Sequence[Path] = (), guard: bool = True) -> LintReport:
    """`popkit check`: read the file once and run every rule on those bytes."""
    content = read_bytes(path)
    report = check_bytes(content, Path(path).name, leaderboard=leaderboard, gpu=gpu, mode=mode,
                         resolve_gpus=True, roots=roots, guard=guard, path=str(path))
    if Path(path).suffix != ".py":
        return report
    return replace(report, precompile=predict_file(Path(path), content=content).to_json())


__all__ = ["GuardPattern", "GuardVerdict", "LintReport", "check_bytes", "check_file",
           "offered_gpus_for", "run_kernelguard", "read_bytes", "MAX_BYTES", "EXTENSIONS", "RULES"]
