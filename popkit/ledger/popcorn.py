"""popcorn-cli, and nothing else: find it, stage the bytes it gets, build its command line, call it, read
its output. The submit workflow around it (check, gate, record) is popkit.ledger.submit.

The hand-off is a pure argv builder plus one subprocess call with a timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from popkit.errors import PopcornError, SubmissionError
from popkit.model.results import RemoteResult

POPCORN_ENV = "POPKIT_POPCORN"
EXECUTABLES = ("popcorn-cli", "popcorn")
DEFAULT_TIMEOUT_S = 3600.0  # a leaderboard submission waits in the queue, then runs two ranked chains
TAIL_LINES = 20
TAIL_LINE_CHARS = 200  # a line of popcorn-cli's output quoted in a hint is cut to this many characters
REGISTER_HINT = "run `popcorn-cli register discord` (or `popcorn-cli register github`) once"
INSTALL_HINT = ("install popcorn-cli and put it on PATH, or set POPKIT_POPCORN (it is a release binary"
                " of gpu-mode/popcorn-cli on GitHub; it may be installed as `popcorn-cli` or `popcorn`)")

_SCORE = re.compile(r"^\s*geomean score \((public|secret)\) on ([^:]+):\s*([-+0-9.eE]+)\s*s\s*$",
                    re.IGNORECASE | re.MULTILINE)
_RATE_LIMIT = re.compile(r"\b429\b|too many requests|rate.?limit", re.IGNORECASE)
_HACKED = re.compile(r"\bhack(ed)?\b", re.IGNORECASE)

# ------------------------------------------------------------------------------ reading output


def parse_output(text: str) -> RemoteResult | None:
    """Score lines, then the JSON object after a blank line; None when no JSON object is there."""
    scores: dict[str, float] = {}
    gpu = None
    for kind, name, value in _SCORE.findall(text):
        try:
            scores[kind.lower()] = float(value)
        except ValueError:
            continue
        gpu = name.strip()
    doc = None
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^\{", text, re.MULTILINE):
        try:
            candidate, _ = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # not JSON, or nested past Python's stack: no result
            continue
        if isinstance(candidate, dict) and ("submission_id" in candidate or "runs" in candidate):
            doc = candidate
            break
    if doc is None:
        return None
    try:
        result = RemoteResult.from_json(doc)
    except ValueError:  # not the shape popcorn-cli writes: no result, not a crash
        return None
    return replace(result, score_public_s=scores.get("public"), score_secret_s=scores.get("secret"),
                   score_gpu=gpu)


# ------------------------------------------------------------------------------- popcorn-cli


def find_popcorn(env: Mapping[str, str] | None = None) -> str:
    """POPKIT_POPCORN, else `popcorn-cli`, else `popcorn` on PATH."""
    env = os.environ if env is None else env
    explicit = env.get(POPCORN_ENV)
    if explicit:
        found = shutil.which(explicit, path=env.get("PATH"))
        if found is None:
            raise PopcornError(f"{POPCORN_ENV}={explicit}: not an executable file", INSTALL_HINT)
        return found
    for name in EXECUTABLES:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise PopcornError("popcorn-cli not found (looked for `popcorn-cli` and `popcorn` on PATH)", INSTALL_HINT)


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """popcorn-cli's registration file, ~/.popcorn.yaml (HOME decides, as for popcorn-cli)."""
    env = os.environ if env is None else env
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".popcorn.yaml"


def registration_problem(env: Mapping[str, str] | None = None) -> str:
    """Why popcorn-cli would refuse to submit for lack of registration; empty when registered."""
    path = config_path(env)
    if not path.is_file():
        return f"{path} not found"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror or exc})"
    if not re.search(r"^\s*cli_id\s*:\s*\S", text, re.MULTILINE):
        return f"{path} has no cli_id"
    return ""


def build_argv(exe: str, file: Path | str, *, gpu: str, leaderboard: str, mode: str,
               output: Path | str) -> list[str]:
    """The exact popcorn-cli command line: flags override directives, and there is no TUI."""
    return [exe, "submit", "--gpu", gpu, "--leaderboard", leaderboard, "--mode", mode, "--no-tui",
            "-o", str(output), str(file)]


def stage_copy(content: bytes, name: str, sha256: str, folder: Path) -> Path:
    """Write `content` under `name` in `folder` (the caller's proc.WorkDir, removed even if popkit is killed)
    and prove the copy is byte-identical."""
    copy = Path(folder) / name
    copy.write_bytes(content)
    written = hashlib.sha256(copy.read_bytes()).hexdigest()
    if written != sha256:
        raise SubmissionError(f"{copy}: the staged copy differs from the checked file (sha256 {written[:12]}"
                              f" ≠ {sha256[:12]})", "the disk may be full; nothing was submitted")
    return copy


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last lines of `text`, each cut to TAIL_LINE_CHARS: a hint stays a few lines whatever was printed."""
    return "\n".join(_cut(line) for line in text.rstrip().splitlines()[-lines:])


def _cut(line: str) -> str:
    extra = len(line) - TAIL_LINE_CHARS
    return line if extra <= 0 else f"{line[:TAIL_LINE_CHARS]} … ({extra} characters cut)"


def call_popcorn(argv: Sequence[str], output: Path, timeout_s: float,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> RemoteResult:
    """Run popcorn-cli once and read its result (the -o file, else stdout); errors say what happened."""
    try:
        proc = run(list(argv), capture_output=True, text=True, encoding="utf-8", errors="replace",
                   timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PopcornError(f"popcorn-cli did not finish in {timeout_s:g} s",
                           "the remote run may still finish: check the leaderboard, or raise --timeout") from None
    except OSError as exc:
        raise PopcornError(f"cannot run {argv[0]}: {exc.strerror or exc}", INSTALL_HINT) from None
    both = (proc.stdout or "") + ("\n" + proc.stderr if proc.stderr else "")
    written = output.read_text(encoding="utf-8", errors="replace") if output.is_file() else ""
    result = parse_output(written) or parse_output(proc.stdout or "")
    if result is None or proc.returncode != 0:
        _raise_failure(proc.returncode, both, result is None)
    assert result is not None
    return result


def _raise_failure(returncode: int, both: str, no_result: bool) -> None:
    # A refused request prints no result; where a result is there, its JSON may hold 429 as an id.
    if no_result and _RATE_LIMIT.search(both):
        raise PopcornError("rate-limited by the leaderboard (HTTP 429)",
                           "submissions are limited per hour; wait, and meanwhile iterate with `popkit bench`:\n"
                           + _tail(both, 5))
    if returncode != 0:
        what = "flagged as hacked" if _HACKED.search(both) else f"failed (popcorn-cli exit {returncode})"
        raise PopcornError(f"remote submission {what}", "popcorn-cli's last lines:\n" + _tail(both))
    if no_result:
        raise PopcornError("popcorn-cli finished but printed no result JSON",
                           "popcorn-cli's last lines:\n" + (_tail(both) or "(no output)"))
