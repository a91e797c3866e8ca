"""Compiler output -> diagnostics at line:column of the user's submission file.

load_inline writes the `cpp_sources` / `cuda_sources` strings into main.cpp and cuda.cu (joined with
newlines, after a few header lines of its own, and main.cpp ends with the pybind11 bindings of
`functions=`). A compiler message about line L of those files is mapped back by finding each
string literal of the submission inside the generated file: the literal's characters know their
own line and column in the submission, escapes and line continuations included.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import tokenize
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

GENERATED_NAMES = ("main.cpp", "cuda.cu", "cuda.hip", "main_hip.cpp", "sycl.sycl", "device.hip", "device.cu")

_GCC = re.compile(r"^(?P<file>(?:[A-Za-z]:)?[^:\n]+?):(?P<line>\d+):(?:(?P<col>\d+):)? "
                  r"(?P<sev>fatal error|error|warning|note): (?P<msg>.*)$")
_EDG = re.compile(r"^(?P<file>[^\n()]+?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark)"
                  r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")
_PTXAS = re.compile(r"^ptxas\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
_LD = re.compile(r"^(?:\S*/)?(?:ld(?:\.\w+)?|collect2)(?:: (?P<sev>error|warning))?: (?P<msg>.*)$")
_UNDEF_REF = re.compile(r"undefined reference to [`'](?P<sym>[^'`]+)'")
_UNDEF_SYM = re.compile(r"undefined symbol: (?P<sym>\S+)")
ERROR, WARNING = "error", "warning"  # finding severities: errors block a submission
_MANGLED = re.compile(r"'(?P<sym>_Z\w+)'")


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a submission: a compiler, loader or static-check message, or a `popkit check`
    rule, placed in the submission where possible. The one finding type of popkit."""

    severity: str  # error, warning, note; an error of `popkit check` blocks a submission
    tool: str  # nvcc, ptxas, gcc, clang, ld, loader, python, static, check
    message: str
    file: str = ""  # the submission, or the generated file when the line could not be mapped
    line: int | None = None  # 1-based; None when the problem has no place
    column: int | None = None  # 1-based
    source_line: str = ""  # the text of that line
    generated: str = ""  # where the compiler saw it ("cuda.cu:12:5"), empty for static checks
    hint: str = ""
    rule: str = ""  # the `popkit check` rule that found it (stream, directive, ...); empty for compilers

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Diagnostic":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @property
    def location(self) -> str:
        parts = [self.file] + [str(x) for x in (self.line, self.column) if x is not None]
        return ":".join(parts)


def finding(rule: str, severity: str, line: int | None, column: int | None, message: str,
            hint: str = "") -> Diagnostic:
    """A `popkit check` rule's diagnostic (the report names the file)."""
    return Diagnostic(severity, "check", message, line=line, column=column, hint=hint, rule=rule)


@dataclass(frozen=True)
class RawDiagnostic:
    tool: str
    severity: str
    message: str
    path: str | None = None
    line: int | None = None
    column: int | None = None
    symbol: str = ""  # a mangled or demangled name (ptxas, linker, loader)


# ------------------------------------------------------------------------------ parsing the log


def first_error(found: Iterable[Diagnostic], output: str) -> str:
    """Why a build failed, in one line: the first compiler message placed in the submission (`found`), else the
    first line of the build's `output` that names an error, else its first line."""
    first = next(iter(found), None)
    if first is not None:
        return f"{first.location}: {first.message}"
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no output")[:300]


def parse_log(log: str, compiler: str = "gcc") -> list[RawDiagnostic]:
    """Compiler, assembler and linker messages in a build log, in order, without duplicates.

    `compiler` names the host compiler for file:line:col messages (gcc or clang).
    """
    found: list[RawDiagnostic] = []
    lines = log.splitlines()
    for n, text in enumerate(lines):
        text = text.rstrip()
        m = _EDG.match(text)
        if m:
            column, details = _edg_context(lines, n)
            message = m.group("msg") + "".join(f"; {d}" for d in details)
            found.append(RawDiagnostic("nvcc", _severity(m.group("sev")), message, m.group("file"),
                                       int(m.group("line")), column))
            continue
        m = _GCC.match(text)
        if m and not text.startswith(("In file included", "                 from")):
            col = int(m.group("col")) if m.group("col") else None
            found.append(RawDiagnostic(compiler, _severity(m.group("sev")), m.group("msg"), m.group("file"),
                                       int(m.group("line")), col))
            continue
        m = _PTXAS.match(text)
        if m:
            sym = _MANGLED.search(m.group("msg"))
            found.append(RawDiagnostic("ptxas", _severity(m.group("sev")), m.group("msg"),
                                       symbol=sym.group("sym") if sym else ""))
            continue
        ref = _UNDEF_REF.search(text)
        m = _LD.match(text)
        if ref or (m and "ld returned" not in text):
            message = f"undefined reference to `{ref.group('sym')}`" if ref else m.group("msg")
            found.append(RawDiagnostic("ld", "error" if ref or (m and m.group("sev") != "warning") else "warning",
                                       message, symbol=ref.group("sym") if ref else ""))
    unique: dict[tuple, RawDiagnostic] = {}
    for d in found:  # nvcc compiles device code once per architecture: the same error repeats
        unique.setdefault((d.tool, d.severity, d.message, d.path and Path(d.path).name, d.line, d.column), d)
    return list(unique.values())


def _severity(word: str) -> str:
    word = word.lower()
    if "error" in word or word == "fatal":
        return "error"
    return "note" if word in ("note", "remark") else "warning"


def _edg_context(lines: list[str], n: int) -> tuple[int | None, list[str]]:
    """nvcc (EDG) prints detail lines, the source line indented by two spaces, then a caret line."""
    details: list[str] = []
    for k in range(n + 1, min(n + 8, len(lines))):
        if lines[k].strip() == "^":
            echo = lines[k - 1]
            if details and details[-1] == echo.strip():
                details.pop()
            return lines[k].index("^") - 1, details  # the echo adds two columns; columns are 1-based
        if not lines[k].strip() or _EDG.match(lines[k]):
            break
        details.append(lines[k].strip())
    return None, [d for d in details if not d.startswith("Remark:")][:3]


def symbol_name(symbol: str) -> str:
    """The plain function name in a (possibly mangled) symbol: `_Z3addN2at6TensorE` -> `add`."""
    text = demangle(symbol)
    text = re.sub(r"\(.*$", "", text)
    return re.split(r"::|\s", text)[-1]


def demangle(symbol: str) -> str:
    if not symbol.startswith("_Z"):
        return symbol
    tool = shutil.which("c++filt")
    if tool:
        try:
            out = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=10).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    m = re.match(r"_Z(?:N\d*)?(\d+)(\w+)", symbol)  # without c++filt: the first name component
    return m.group(2)[: int(m.group(1))] if m else symbol


# -------------------------------------------------------------------------- the submission's side


@dataclass(frozen=True)
class _Literal:
    value: str
    positions: tuple[tuple[int, int], ...]  # per character of value: (line, 0-based column) in the file


def string_literals(text: str) -> list[_Literal]:
    """Every plain (not bytes, not f-) string literal with the source position of each character."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return out
    for tok in tokens:
        if tok.type != tokenize.STRING:
            continue
        m = re.match(r"([rRbBuUfF]*)('''|\"\"\"|'|\")", tok.string)
        if not m or set(m.group(1).lower()) & {"b", "f"}:
            continue
        raw = "r" in m.group(1).lower()
        body = tok.string[m.end(): len(tok.string) - len(m.group(2))]
        line, col = tok.start[0], tok.start[1] + m.end()
        chars, positions, i = [], [], 0
        while i < len(body):
            ch = body[i]
            if ch == "\\" and not raw and i + 1 < len(body):
                if body[i + 1] == "\n":  # a line continuation adds no character
                    i, line, col = i + 2, line + 1, 0
                    continue
                size = _escape_size(body, i)
                try:
                    value = ast.literal_eval('"' + body[i: i + size] + '"')
                except (SyntaxError, ValueError):
                    value = body[i: i + size]
                for c in value:
                    chars.append(c)
                    positions.append((line, col))
                i, col = i + size, col + size
                continue
            chars.append(ch)
            positions.append((line, col))
            line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
            i += 1
        out.append(_Literal("".join(chars), tuple(positions)))
    return out


def _escape_size(body: str, i: int) -> int:
    nxt = body[i + 1]
    if nxt in "01234567":
        m = re.match(r"[0-7]{1,3}", body[i + 1:])
        return 1 + len(m.group(0))
    sizes = {"x": 4, "u": 6, "U": 10}
    if nxt in sizes:
        return sizes[nxt]
    if nxt == "N" and i + 2 < len(body) and body[i + 2] == "{":
        return body.index("}", i) - i + 1
    return 2


class SourceMap:
    """Maps positions in load_inline's generated files back to the submission file."""

    def __init__(self, path: Path | str, text: str):
        self.path, self.text = str(path), text
        self.lines = text.splitlines()
        self.literals = sorted((lit for lit in string_literals(text) if lit.value.strip()),
                               key=lambda lit: -len(lit.value))
        self._call = self._load_inline_call()

    def _load_inline_call(self) -> ast.Call | None:
        try:
            tree = ast.parse(self.text)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "load_inline":
                    return node
        return None

    def line_text(self, line: int | None) -> str:
        return self.lines[line - 1] if line and 0 < line <= len(self.lines) else ""

    def extension_names(self) -> list[str]:
        names = []
        for node in ast.walk(ast.parse(self.text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "load_inline":
                for kw in node.keywords:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        names.append(kw.value.value)
        return names

    def map(self, generated: str, line: int, column: int | None) -> tuple[int, int | None] | None:
        """(line, column) in the submission for 1-based (line, column) of a generated file's text."""
        starts = [0]
        for m in re.finditer("\n", generated):
            starts.append(m.end())
        if not 0 < line <= len(starts):
            return None
        line_start = starts[line - 1]
        line_end = starts[line] - 1 if line < len(starts) else len(generated)
        gen_line = generated[line_start:line_end]
        indent = len(gen_line) - len(gen_line.lstrip())
        offset = line_start + (column - 1 if column else indent)
        for lit in self.literals:
            idx = generated.find(lit.value)
            aligned = idx == 0 or (idx > 0 and generated[idx - 1] == "\n")
            if idx < 0 or not (aligned or ("\n" in lit.value and len(lit.value) >= 20)):
                continue
            if idx <= offset < idx + len(lit.value):
                src_line, src_col = lit.positions[offset - idx]
                return src_line, (src_col + 1) if column else None
        return self._by_text(gen_line, column)

    def _by_text(self, gen_line: str, column: int | None) -> tuple[int, int | None] | None:
        """Fallback: the generated line's text appears on exactly one line of the submission."""
        text = gen_line.strip()
        if len(text) < 6:
            return None
        hits = [n for n, s in enumerate(self.lines, 1) if s.strip() == text]
        if len(hits) != 1:
            return None
        src = self.lines[hits[0] - 1]
        shift = src.index(text) - gen_line.index(text)
        return hits[0], (column + shift) if column else None

    def call_position(self) -> tuple[int, int] | None:
        return (self._call.lineno, self._call.col_offset + 1) if self._call else None

    def functions_entry(self, name: str) -> tuple[int, int] | None:
        """Where `functions=[..., "name", ...]` names `name` (or the functions= argument itself)."""
        if not self._call:
            return None
        for kw in self._call.keywords:
            if kw.arg == "functions":
                for elt in getattr(kw.value, "elts", []):
                    if isinstance(elt, ast.Constant) and elt.value == name:
                        return elt.lineno, elt.col_offset + 1
                return kw.value.lineno, kw.value.col_offset + 1
        return self.call_position()

    def definition(self, name: str) -> tuple[int, int] | None:
        """The line that declares or defines C++ function `name` (a __global__ kernel first)."""
        pattern = re.compile(rf"\b{re.escape(name)}\s*\(")
        best = None
        for n, s in enumerate(self.lines, 1):
            m = pattern.search(s)
            if m and re.search(r"\b(__global__|void|Tensor|int|float|auto)\b", s[: m.start()]):
                if "__global__" in s:
                    return n, m.start() + 1
                best = best or (n, m.start() + 1)
        return best


# ------------------------------------------------------------------------------------ mapping


def map_diagnostics(raw: Iterable[RawDiagnostic], source: SourceMap, build_dir: Path | None) -> list[Diagnostic]:
    """Place raw diagnostics in the submission; messages about other files keep their own path."""
    cache: dict[str, str | None] = {}
    out = []
    for d in raw:
        if d.path is not None:
            out.append(_map_file(d, source, _generated_text(d.path, build_dir, cache)))
        else:
            out.append(_map_symbol(d, source))
    return [d for d in out if d is not None]


def _generated_text(path: str, build_dir: Path | None, cache: dict[str, str | None]) -> str | None:
    if path in cache:
        return cache[path]
    candidates = [Path(path)]
    if build_dir is not None and Path(path).name in GENERATED_NAMES:
        candidates += sorted(build_dir.rglob(Path(path).name))
    text = None
    for cand in candidates:
        if cand.name in GENERATED_NAMES and cand.is_file():
            text = cand.read_text(encoding="utf-8", errors="replace")
            break
    cache[path] = text
    return text


def _map_file(d: RawDiagnostic, source: SourceMap, generated: str | None) -> Diagnostic | None:
    where = f"{Path(d.path).name}:{d.line}" + (f":{d.column}" if d.column else "")
    if generated is None:  # a torch or system header: keep errors, drop the headers' own warnings
        if d.severity != "error":
            return None
        return Diagnostic(d.severity, d.tool, d.message, d.path, d.line, d.column, "", where)
    mapped = source.map(generated, d.line, d.column)
    gen_line = generated.splitlines()[d.line - 1] if 0 < d.line <= generated.count("\n") + 1 else ""
    hint = ""
    if mapped is None:
        bound = re.search(r'm\.def\("(\w+)"', gen_line)
        if bound:  # the pybind11 block load_inline generates from functions=
            mapped = source.functions_entry(bound.group(1))
            hint = (f"functions= names `{bound.group(1)}`, so cpp_sources must declare a C++ function of that "
                    "name with the wrapper's exact signature")
        elif d.line <= 3:  # load_inline's own #include lines
            mapped = source.call_position()
    if mapped is None:
        return Diagnostic(d.severity, d.tool, d.message, d.path or "", d.line, d.column, gen_line.rstrip(), where)
    line, column = mapped
    return Diagnostic(d.severity, d.tool, d.message, source.path, line, column, source.line_text(line), where, hint)


def _map_symbol(d: RawDiagnostic, source: SourceMap) -> Diagnostic:
    name = symbol_name(d.symbol) if d.symbol else ""
    message = d.message
    if d.symbol and d.symbol.startswith("_Z"):
        message = message.replace(d.symbol, f"{d.symbol} ({demangle(d.symbol)})")
    hint = ""
    if d.tool in ("ld", "loader") and name:
        if demangle(d.symbol).startswith(("c10::", "at::", "torch::", "pybind11::")):
            hint = ("a torch symbol is missing: the build links against another torch than the one importing it; "
                    "rebuild with --clean (and delete old builds under TORCH_EXTENSIONS_DIR)")
        else:
            hint = (f"`{name}` is declared but never defined with this exact signature: make the declaration in "
                    "cpp_sources match the definition in cuda_sources")
    where = source.definition(name) if name else None
    if where is None:
        return Diagnostic(d.severity, d.tool, message, source.path, None, None, "", "", hint)
    return Diagnostic(d.severity, d.tool, message, source.path, where[0], where[1], source.line_text(where[0]), "", hint)


def loader_diagnostic(message: str, source: SourceMap) -> Diagnostic | None:
    """An ImportError `undefined symbol: X` when the built library is loaded."""
    m = _UNDEF_SYM.search(message)
    if not m:
        return None
    raw = RawDiagnostic("loader", "error", f"undefined symbol {m.group('sym')} when loading the extension",
                        symbol=m.group("sym"))
    return _map_symbol(raw, source)


# ----------------------------------------------------------------- import failures that are not the compiler's

TASK_MODULES = ("task", "utils", "reference")  # files every problem set puts beside submission.py
_CPP_EXTENSION = "torch/utils/cpp_extension"
_TORCH_HINTS = (  # (function or message fragment, hint): what a failure inside torch's builder means
    ("_get_cuda_arch_flags", "torch found no GPU architecture to build for (no GPU here): set TORCH_CUDA_ARCH_LIST "
                             "(9.0a for H100) or add `#!POPCORN gpu H100`"),
    ("CUDA_HOME", "torch cannot find the CUDA toolkit: export CUDA_HOME=/usr/local/cuda (popkit doctor checks)"),
    ("Ninja is required", "load_inline builds with ninja: pip install ninja"),
    ("_run_ninja_build", "the compiler failed and none of its messages could be placed in your file: "
                         "`popkit compile --json` has the whole build log (`log`)"),
)
_GENERIC_TORCH_HINT = ("the failure is inside torch's extension builder, not in your code: `popkit doctor` checks torch, "
                       "nvcc and ninja; `popkit compile --json` has the whole traceback (`log`)")


def task_imports(text: str) -> list[tuple[str, int]]:
    """(module, line) of each import of a task's own file (`from task import input_t`), in line order."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in TASK_MODULES]
    return sorted(found, key=lambda item: item[1])


def torch_error(error_type: str, error: str, frames: Iterable[Iterable[Any]]) -> tuple[str, str] | None:
    """(one-line message, hint) for an exception raised inside torch's cpp_extension (load_inline's builder),
    else None. `frames`: (file, line[, function]) from the outermost to the deepest."""
    inside = [tuple(f) for f in frames if _CPP_EXTENSION in str(list(f)[0]).replace("\\", "/")]
    if not inside:
        return None
    file, line, *rest = inside[-1]
    function = rest[0] if rest else ""
    short = str(file).replace("\\", "/")
    short = short[short.rindex("torch/utils/"):]
    first = (error.strip().splitlines() or [""])[0][:300]
    where = f"{short}:{line}" + (f" in {function}" if function else "")
    message = f"torch's extension builder raised {error_type}" + (f": {first}" if first else "") + f" ({where})"
    hint = next((h for key, h in _TORCH_HINTS if key == function or key in error), _GENERIC_TORCH_HINT)
    return message, hint


def missing_module_hint(error_type: str, error: str, python: str) -> str:
    """A hint for `No module named 'x'`: a task file needs --task, any other module an install."""
    m = re.search(r"No module named '([\w.]+)'", error)
    if error_type != "ModuleNotFoundError" or not m:
        return ""
    module = m.group(1).split(".")[0]
    if module in TASK_MODULES:
        return (f"`{module}` is one of the task's files: pass --task NAME (with --tasks-root DIR for a problem set's "
                "leaderboard name) so that popkit puts them beside the submission")
    return (f"`{module}` is not installed for {python}: install it (pip install {module.replace('_', '-')}) if the "
            "leaderboard's runner has it; popkit builds with the interpreter of --python")


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)', re.MULTILINE)


def submission_frame(traceback_text: str, name: str = "submission.py") -> tuple[int, str] | None:
    """(line, function) of the deepest frame of the submission (the file called `name` in the working
    directory) in a Python traceback, or None when the traceback never entered it."""
    found = [(int(m.group("line")), m.group("func")) for m in _FRAME.finditer(traceback_text or "")
             if m.group("file").replace("\\", "/").rsplit("/", 1)[-1] == name]
    return found[-1] if found else None
