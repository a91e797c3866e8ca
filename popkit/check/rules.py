"""The one table of `popkit check` rules: id, severities, a one-line summary, a doc line and a fixture.

Every finding of `popkit check` goes through `finding` here, which refuses an id or a severity the table
does not list, so the table is the whole list of what the linter can say. Each rule's fixture is a
minimal file that triggers that rule and no other (tests/test_lint_rules.py runs every one);
`popkit check --rules` prints the table, and docs/check.md holds `rules_markdown()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from popkit.model.diagnostics import ERROR, WARNING, Diagnostic
from popkit.model.diagnostics import finding as _diagnostic

RULES_SCHEMA = "popkit/rules/1"
MAX_BYTES = 1_000_000  # the server's size limit for a submission file
EXTENSIONS = (".py", ".cu", ".cuh", ".cpp")  # the extensions the server accepts
_PUBLIC_SETS = "git clone https://github.com/gpu-mode/reference-kernels, then --tasks-root reference-kernels/problems"
GUARD_INSTALL = "pip install 'popkit[guard]'"  # how to install the optional KernelGuard analyser

_OK = "def custom_kernel(data):\n    return data\n"  # a file every rule passes


@dataclass(frozen=True)
class Fixture:
    """A minimal file that triggers one rule and no other.

    `text` is its UTF-8 content (`data`, raw bytes, replaces it when set), padded with a trailing comment
    to `pad_to` bytes; `options` are `lint.check_bytes` keyword arguments (the --leaderboard, --gpu, --mode
    flags, a leaderboard's GPU list); `guard` is the verdict KernelGuard returns for it (a fake one in tests).
    """

    text: str
    name: str = "submission.py"
    data: bytes | None = None
    pad_to: int = 0
    options: tuple[tuple[str, Any], ...] = ()
    guard: Mapping[str, Any] | None = None

    def content(self) -> bytes:
        content = self.data if self.data is not None else self.text.encode("utf-8")
        if self.pad_to > len(content):
            content += b"#" + b"x" * (self.pad_to - len(content) - 2) + b"\n"
        return content

    def to_json(self) -> dict:
        return {"name": self.name, "text": self.text if self.data is None else None,
                "bytes": self.data.hex() if self.data is not None else None, "pad_to": self.pad_to,
                "options": {k: list(v) if isinstance(v, tuple) else v for k, v in self.options},
                "guard": dict(self.guard) if self.guard is not None else None}


@dataclass(frozen=True)
class Rule:
    """One rule: `severities` lists what its findings may be, the first being what its fixture gives."""

    id: str
    severities: tuple[str, ...]
    summary: str
    doc: str
    fixture: Fixture

    @property
    def severity(self) -> str:
        return "/".join(self.severities)

    def to_json(self) -> dict:
        return {"id": self.id, "severity": self.severity, "severities": list(self.severities),
                "summary": self.summary, "doc": self.doc, "fixture": self.fixture.to_json()}


E, W, EW = (ERROR,), (WARNING,), (ERROR, WARNING)
_HACKED_VERDICT = {"classification": "hacked", "should_filter": True,
                   "matched_patterns": [{"pattern": "TIMER_MONKEYPATCH", "severity": "critical",
                                         "evidence": "torch.cuda.synchronize patched"}]}

RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------------- what the server refuses
    Rule("extension", E, "a file extension the server refuses",
         "the server takes .py, .cu, .cuh and .cpp files only", Fixture("x = 1\n", name="kernel.txt")),
    Rule("size", E, "a file over the server's 1,000,000-byte limit",
         "move generated tables or embedded binaries out of the file", Fixture(_OK, pad_to=MAX_BYTES + 1)),
    Rule("empty", E, "an empty file", "the server refuses it; write the kernel in it", Fixture("", name="kernel.cu")),
    Rule("utf8", E, "bytes that are not UTF-8", "the server reads the file as UTF-8; save it so",
         Fixture("", data=b"def custom_kernel(data):\n    return data  # \xff\n")),
    Rule("bom", W, "a UTF-8 byte-order mark at the start",
         "Python skips it, but the server reads it as part of line 1, so a directive there does not count",
         Fixture("\ufeff" + _OK)),
    Rule("stream", E, "the word `stream`, in any case, anywhere (comments included)",
         "the server refuses any file containing it; work on the default stream",
         Fixture(_OK + "# " + "str" + "eam\n")),
    Rule("directive", E, "a `#!POPCORN` directive without a value, unknown or repeated",
         "only `#!POPCORN leaderboard NAME` and `#!POPCORN gpu NAME`, once each, in the leading comment block",
         Fixture("#!POPCORN leaderboard\n" + _OK)),
    Rule("directive-outside-block", W, "a directive below the leading comment block",
         "popcorn-cli uses it, the server ignores it: move it to the top lines",
         Fixture(_OK + "#!POPCORN gpu H100\n")),
    Rule("popkit-tune", W, "a `#!POPKIT tune` or `tune-if` line that `popkit tune` refuses",
         "the server ignores `#!POPKIT` lines; `popkit tune` needs `#!POPKIT tune NAME=v1,v2` (number literals) and a "
         "module-level `NAME = v`",
         Fixture("#!POPKIT tune VEC=two\nVEC = 2\n" + _OK)),
    Rule("directive-conflict", E, "a directive that popcorn-cli and the server read differently",
         "popcorn-cli sends the last one, the server reads the first: keep one of each kind",
         Fixture("#!POPCORN gpu H100\n" + _OK + "#!POPCORN gpu A100\n")),
    Rule("leaderboard-case", E, "a leaderboard name with uppercase letters",
         "popcorn-cli lowercases the name it sends and the server wants the directive to match: write it lowercase",
         Fixture("#!POPCORN leaderboard VectorAdd\n" + _OK)),
    Rule("leaderboard-mismatch", E, "--leaderboard differs from the file's directive",
         "the server refuses the mismatch: drop the flag or change the directive",
         Fixture("#!POPCORN leaderboard vectoradd\n" + _OK, options=(("leaderboard", "grayscale"),))),
    Rule("gpu-several", W, "several GPUs in one directive",
         "popcorn-cli submits to the first; pass --gpu to choose", Fixture("#!POPCORN gpu H100, A100\n" + _OK)),
    Rule("gpu-not-offered", E, "a GPU the leaderboard does not offer",
         "the leaderboard's problem set lists its GPUs; pick one of them",
         Fixture(_OK, options=(("leaderboard", "vectoradd"), ("gpu", "B300"), ("offered_gpus", ("H100", "A100"))))),
    Rule("leaderboard-closed", E, "a leaderboard whose deadline has passed",
         "the server takes no submission after it; `popkit tasks --tasks-root PROBLEMS` shows the open ones",
         Fixture(_OK, options=(("leaderboard", "vectoradd"), ("standing", {"leaderboard": "vectoradd", "state": "closed", "deadline": "2025-06-30"})))),
    Rule("leaderboard-unknown", (WARNING, ERROR), "a leaderboard that no problem set popkit knows names",
         "an error where --tasks-root (or POPKIT_TASKS_PATH) gives problem sets and none names it, a warning where "
         "none is given: popkit knows leaderboards from the public problem sets (" + _PUBLIC_SETS + ")",
         Fixture(_OK, options=(("leaderboard", "nosuchboard"), ("standing", {"leaderboard": "nosuchboard", "state": "unknown"})))),
    Rule("practice-task", W, "a leaderboard name popkit knows only as its own practice task",
         "its cases are popkit's, not a leaderboard's; whether a leaderboard of that name is open the public problem "
         "sets say (" + _PUBLIC_SETS + ")",
         Fixture(_OK, options=(("leaderboard", "softmax"), ("standing", {"leaderboard": "softmax", "state": "practice"})))),
    Rule("mode", E, "a mode the server does not know", "modes: test, benchmark, leaderboard, profile",
         Fixture(_OK, options=(("mode", "ranked"),))),
    Rule("kernelguard", EW, "KernelGuard's verdict, when it is installed",
         f"the leaderboard screens submissions with it ({GUARD_INSTALL}); `hacked` is not ranked",
         Fixture(_OK, guard=_HACKED_VERDICT)),
    # ---------------------------------------------------------------------------- a Python submission
    Rule("syntax", E, "a syntax error", "the remote run would fail at import; `python -m py_compile FILE` agrees",
         Fixture("def custom_kernel(data:\n    return data\n")),
    Rule("no-custom-kernel", E, "no `custom_kernel` at module level",
         "the eval imports it from the submission", Fixture("import math\n")),
    Rule("result-fd", E, "the harness's result pipe named or written (POPCORN_FD, a raw file descriptor)",
         "a submission must never touch the pipe its verdict is read from",
         Fixture("import os\n\nFD = os.environ['POPCORN_FD']\n" + _OK)),
    Rule("timer-patch", E, "a timer, `synchronize` or CUDA event replaced",
         "the harness times with them; they must stay as torch and time define them",
         Fixture("import torch\n\ntorch.cuda.synchronize = lambda: None\n" + _OK)),
    Rule("harness-import", E, "the evaluator imported, or a task file loaded by path",
         "a submission must not reach into the harness that times and checks it",
         Fixture("import eval\n" + _OK)),
    Rule("harness-patch", E, "the checker, the reference, builtins or a module dictionary replaced or used",
         "the checker and reference must run as the task defines them",
         Fixture("import builtins\n\nbuiltins.print = None\n" + _OK)),
    Rule("reference-import", W, "the task's reference imported",
         "fine for a fallback to ref_kernel; reading generate_input to predict inputs is a hack",
         Fixture("from reference import ref_kernel\n" + _OK)),
    Rule("sys-modules", EW, "`sys.modules` written or read, or `__mp_main__` named (a warning with `# popkit: allow sys-modules -- why`)",
         "the module table reaches the harness's own module in the worker; say why an honest kernel needs it",
         Fixture("import sys\n\nsys.modules['time'] = None\n" + _OK)),
    Rule("frame-walk", EW, "interpreter frames or the garbage collector's object lists walked (a warning with `# popkit: allow frame-walk -- why`)",
         "frames reach the harness's variables: expected outputs, timers",
         Fixture("import sys\n\nF = sys._getframe(1)\n" + _OK)),
    Rule("runtime-install", E, "packages installed at run time",
         "the leaderboard flags runtime installs; use what the runner image has", Fixture("import pip\n" + _OK)),
    Rule("exec-built", W, "`exec`, `eval` or `compile` of a string built at run time",
         "reviewers can't read generated code (popkit checks what it can fold); write it out",
         Fixture("SRC = 'x' + ' = 1'\nexec(SRC)\n" + _OK)),
    Rule("code-object", W, "a function or code object built at run time (types.FunctionType, CodeType, marshal,"
         " `__code__`)", "code that never appears as source escapes review and every rule here",
         Fixture("import types\n\nF = types.FunctionType(compile('', 'k', 'exec'), {})\n" + _OK)),
    Rule("unpickle", EW, "pickled objects loaded (pickle, dill, joblib, torch.load with weights_only=False)",
         "loading a pickle runs any code it names: an error when the embedded bytes call a function",
         Fixture("import pickle\n\nX = pickle.loads(b'cos\\nsystem\\n(S\"true\"\\ntR.')\n" + _OK)),
    Rule("load-by-path", EW, "a module loaded from a file path (importlib.util, runpy, SourceFileLoader)",
         "an error for a task file (eval.py, reference.py, utils.py, task.py): a fresh copy outside the harness",
         Fixture("import runpy\n\nG = runpy.run_path('eval.py')\n" + _OK)),
    Rule("module-write", EW, "a .py, .pyc or .pth file (or sitecustomize) written, copied or moved",
         "a module planted in the working folder or on sys.path is imported by the next eval instead of the real one",
         Fixture("from pathlib import Path\n\nPath('hmac.py').write_text('x = 1')\n" + _OK)),
    Rule("dynamic-name", EW, "an attribute or module name built from pieces at run time",
         "an error when it folds to a banned or guarded name (`Str` + `eam`, rot13, chr loops); a warning when"
         " it cannot be folded", Fixture("import torch\n\nS = getattr(torch.cuda, 'synchro' + 'nize')\n" + _OK)),
    Rule("output-cache", EW, "an output cache keyed on `data_ptr()` or `id()` (an error when returned)",
         "freed memory is reused at the same address; the leaderboard rechecks outputs",
         Fixture("_c = {}\n\n\ndef custom_kernel(data):\n    k = data.data_ptr()\n    if k not in _c:\n"
                 "        _c[k] = data * 2\n    return _c[k]\n")),
    Rule("output-replay", W, "`custom_kernel` returns a value kept in a module-level container",
         "every call must compute its output from its own input",
         Fixture("_seen = {}\n\n\ndef custom_kernel(data):\n    _seen.setdefault(0, data)\n    return _seen[0]\n")),
    Rule("thread-start", EW, "a thread or process started in `custom_kernel` (an error) or at import",
         "work can continue after the timer stops; do all of it on the calling thread",
         Fixture("import threading\n\n\ndef custom_kernel(data):\n    threading.Thread(target=print).start()\n"
                 "    return data\n")),
    Rule("mode-branch", EW, "`sys.argv` read (the eval's mode): an error inside `custom_kernel`",
         "behaving differently in test and benchmark mode is a hack",
         Fixture("import sys\n\n\ndef custom_kernel(data):\n    return data if sys.argv[1] else None\n")),
    Rule("lazy-output", W, "a tensor subclass or a torch dispatch hook",
         "its values may be computed only when read, after the timer stops",
         Fixture("import torch\n\n\nclass Lazy(torch.Tensor):\n    pass\n\n\n" + _OK)),
)

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


def finding(rule: str, severity: str, line: int | None, column: int | None, message: str,
            hint: str = "") -> Diagnostic:
    """A `popkit check` finding of a rule in the table; an id or severity the table lacks is a bug."""
    entry = BY_ID.get(rule)
    if entry is None:
        raise ValueError(f"popkit check rule `{rule}` is not in popkit.check.rules.RULES")
    if severity not in entry.severities:
        raise ValueError(f"popkit check rule `{rule}` has no severity `{severity}` in popkit.check.rules.RULES")
    return _diagnostic(rule, severity, line, column, message, hint)


def rules_markdown() -> str:
    """The table as docs/check.md shows it (a test keeps the two the same)."""
    lines = ["| rule | severity | finds | why, what to do |", "|---|---|---|---|"]
    for rule in RULES:
        lines.append(f"| `{rule.id}` | {rule.severity} | {rule.summary} | {rule.doc} |")
    return "\n".join(lines) + "\n"


__all__ = ["BY_ID", "EXTENSIONS", "Fixture", "GUARD_INSTALL", "MAX_BYTES", "RULES", "RULES_SCHEMA", "Rule",
           "finding", "rules_markdown"]
