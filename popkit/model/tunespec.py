"""`#!POPKIT tune` declarations: a submission's tunable parameters, its constraints, the grid, the variants.

A tunable submission declares each parameter on a comment line of its own, anywhere in the file, and
holds one module-level assignment of it with a number literal:

    #!POPKIT tune BLOCK=64,128,256,512
    #!POPKIT tune VEC=1,2,4
    #!POPKIT tune-if BLOCK*VEC <= 1024
    ...
    BLOCK = 128

A variant is the same file with each assignment's value rewritten (`variant_text`), so every variant
is a plain, valid submission. The server ignores these lines: it reads only `#!POPCORN` directives
(docs/protocol-notes.md §6), and popcorn-cli likewise. A `tune-if` line is evaluated by a small
interpreter over the parameters (`Constraint`): numbers, arithmetic, comparisons, `and`/`or`/`not`,
`x if c else y`, `in (..)` and min/max/abs; nothing else of Python runs.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from popkit.errors import SubmissionError

PREFIX = "#!POPKIT"
_LINE = re.compile(r"^\s*#!POPKIT(?:\s+(\S+))?\s*(.*?)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KINDS = ("tune", "tune-if")
MAX_VALUES = 1000  # per parameter; more is a typo, not a search space
MAX_GRID = 1_000_000  # points enumerated before the constraints; a larger space needs fewer values
MAX_POWER = 64  # the largest exponent `**` takes in a constraint (2**64 is still instant)
BOM = "\ufeff"
HINT = ("declare `#!POPKIT tune NAME=V1,V2,...` (number literals) and assign `NAME = V` once at module level; "
        "`#!POPKIT tune-if EXPR` keeps the points where EXPR holds")

Number = int | float


@dataclass(frozen=True)
class Parameter:
    name: str
    values: tuple[Number, ...]
    tokens: tuple[str, ...]  # each value as written on the tune line (written back into variants)
    line: int  # of the `#!POPKIT tune` line, 1-based
    assign_line: int  # of the module-level assignment
    default: Number  # the assignment's value in the file
    default_token: str

    def token(self, value: Number) -> str:
        for v, t in zip(self.values, self.tokens):
            if v == value and type(v) is type(value):
                return t
        return repr(value)


class Constraint:
    """One `#!POPKIT tune-if` expression, checked at parse time, evaluated per point."""

    _BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
            ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
    _CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
    _CALLS = {"min": min, "max": max, "abs": abs}

    def __init__(self, text: str, line: int, path: str):
        self.text, self.line, self.path = text, line, path
        try:
            self.tree = ast.parse(text, mode="eval").body
        except SyntaxError as exc:
            raise self._error(f"`{text}` is not an expression ({exc.msg})") from None
        self.names: set[str] = set()
        self._check(self.tree)

    def _error(self, message: str) -> SubmissionError:
        return SubmissionError(f"{self.path}:{self.line}: tune-if: {message}", HINT)

    def _check(self, node: ast.AST) -> None:
        """Only the forms the evaluator knows; the names are checked against the parameters later."""
        if isinstance(node, ast.Name):
            if node.id not in self._CALLS:
                self.names.add(node.id)
            return
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (bool, int, float)):
                raise self._error(f"`{ast.unparse(node)}`: only numbers, True and False")
            return
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in self._CALLS or node.keywords:
                raise self._error(f"`{ast.unparse(node)}`: the only calls are min, max and abs, with plain arguments")
            for arg in node.args:
                self._check(arg)
            return
        allowed = (ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare,
                   ast.IfExp, ast.Tuple, ast.List, ast.In, ast.NotIn, ast.Load, *self._BIN, *self._CMP)
        if not isinstance(node, allowed):
            raise self._error(f"`{ast.unparse(node)}` is not allowed (numbers, parameters, arithmetic, comparisons,"
                              " and/or/not, `x if c else y`, `in (...)`, min/max/abs)")
        for child in ast.iter_child_nodes(node):
            self._check(child)

    def holds(self, values: Mapping[str, Number]) -> bool:
        try:
            return bool(self._eval(self.tree, values))
        except ZeroDivisionError:
            raise self._error(f"`{self.text}` divides by zero at {label(values)}") from None
        except (OverflowError, TypeError, ValueError) as exc:
            raise self._error(f"`{self.text}` fails at {label(values)} ({exc})") from None

    def _eval(self, node: ast.AST, env: Mapping[str, Number]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.BoolOp):
            results = (self._eval(v, env) for v in node.values)
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, env)
            return not value if isinstance(node.op, ast.Not) else -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
                raise ValueError(f"exponent {right} is above {MAX_POWER}")
            return self._BIN[type(node.op)](left, right)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators):
                right = self._eval(comparator, env)
                if isinstance(op, (ast.In, ast.NotIn)):
                    inside = left in (right if isinstance(right, tuple) else (right,))
                    ok = inside if isinstance(op, ast.In) else not inside
                else:
                    ok = self._CMP[type(op)](left, right)
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self._eval(node.body if self._eval(node.test, env) else node.orelse, env)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self._eval(e, env) for e in node.elts)
        if isinstance(node, ast.Call):
            return self._CALLS[node.func.id](*(self._eval(a, env) for a in node.args))  # type: ignore[attr-defined]
        raise TypeError(f"cannot evaluate {type(node).__name__}")  # _check let through nothing else


@dataclass(frozen=True)
class TuneSpec:
    """The parameters (in declaration order) and constraints of one file."""

    path: str
    parameters: tuple[Parameter, ...]
    constraints: tuple[Constraint, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    @property
    def default(self) -> dict[str, Number]:
        return {p.name: p.default for p in self.parameters}

    @property
    def space_size(self) -> int:
        return math.prod(len(p.values) for p in self.parameters)

    def allows(self, values: Mapping[str, Number]) -> bool:
        return all(c.holds(values) for c in self.constraints)

    def points(self) -> Iterator[dict[str, Number]]:
        """Every point of the grid, in declaration order (the last parameter varies fastest), constraints held."""
        if self.space_size > MAX_GRID:
            raise SubmissionError(f"{self.path}: the tune grid has {self.space_size:,} points, more than "
                                  f"{MAX_GRID:,}", "list fewer values per parameter")
        for combo in itertools.product(*(p.values for p in self.parameters)):
            values = dict(zip(self.names, combo))
            if self.allows(values):
                yield values

    def token(self, name: str, value: Number) -> str:
        return next(p for p in self.parameters if p.name == name).token(value)

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "values": list(p.values), "default": p.default, "line": p.line}
                for p in self.parameters]

    @property
    def per_call(self) -> bool:
        """Whether a value may be set before each call (a per-shape dispatch); tunetriton's configs may not."""
        return True

    def rewrite(self, text: str, values: Mapping[str, Number]) -> str:
        """The file with each parameter's module-level assignment set to `values` (a missing name keeps its value)."""
        bom = BOM if text.startswith(BOM) else ""
        body = text.removeprefix(BOM)
        for param in sorted(self.parameters, key=lambda p: p.assign_line, reverse=True):
            if param.name not in values:
                continue
            start, end = _value_span(body, param.assign_line)
            body = body[:start] + param.token(values[param.name]) + body[end:]
        return bom + body


def label(values: Mapping[str, Number]) -> str:
    """`BLOCK=256 VEC=4`: how a point is named in reports."""
    return " ".join(f"{k}={v!r}" for k, v in values.items())


def _number(token: str) -> Number | None:
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def _assignments(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """Module-level statements that bind a name (by name)."""
    found: dict[str, list[ast.stmt]] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
            continue
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    found.setdefault(sub.id, []).append(node)
    return found


def _literal(node: ast.expr | None) -> Number | None:
    """The number a `NAME = <literal>` assignment holds (a leading minus included), else None."""
    if node is None:
        return None
    inner = node.operand if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) else node
    if not isinstance(inner, ast.Constant) or isinstance(inner.value, bool) or not isinstance(inner.value, (int, float)):
        return None
    return -inner.value if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) else inner.value


def declared(text: str) -> bool:
    """Whether the file has any `#!POPKIT` line (cheap; parse() says whether they are right)."""
    return any(_LINE.match(line) for line in text.splitlines())


def parse(text: str, path: str = "submission.py") -> TuneSpec:
    """The file's tune declarations, checked against its module-level assignments (SubmissionError, exit 4)."""
    text = text.removeprefix(BOM)
    raw: list[tuple[int, str, list[str]]] = []
    constraint_lines: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _LINE.match(line)
        if not match:
            continue
        kind, rest = match.group(1) or "", match.group(2)
        where = f"{path}:{number}"
        if kind not in KINDS:
            raise SubmissionError(f"{where}: unknown `{PREFIX}` line `{kind or '(empty)'}` (known: tune, tune-if)",
                                  HINT)
        if kind == "tune-if":
            if not rest:
                raise SubmissionError(f"{where}: tune-if without an expression", HINT)
            constraint_lines.append((number, rest))
            continue
        name, eq, values = rest.partition("=")
        name = name.strip()
        if not eq or not _NAME.match(name):
            raise SubmissionError(f"{where}: expected `{PREFIX} tune NAME=V1,V2,...` (got `{rest}`)", HINT)
        if name in seen:
            raise SubmissionError(f"{where}: parameter `{name}` declared twice (first on line {seen[name]})", HINT)
        seen[name] = number
        tokens = [t.strip() for t in values.split(",")]
        if not values.strip() or any(not t for t in tokens):
            raise SubmissionError(f"{where}: `{name}` needs a comma-separated list of numbers (got `{values.strip()}`)",
                                  HINT)
        if len(tokens) > MAX_VALUES:
            raise SubmissionError(f"{where}: `{name}` lists {len(tokens)} values, more than {MAX_VALUES}", HINT)
        raw.append((number, name, tokens))
    if not raw:
        raise SubmissionError(f"{path}: no `{PREFIX} tune NAME=V1,V2,...` line: nothing to tune", HINT)
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise SubmissionError(f"{path}:{exc.lineno}:{exc.offset or 0}: syntax error: {exc.msg}",
                              "fix the syntax; `python -m py_compile FILE` shows the same") from None
    bound = _assignments(tree)
    parameters = []
    for number, name, tokens in raw:
        values = []
        for token in tokens:
            value = _number(token)
            if value is None:
                raise SubmissionError(f"{path}:{number}: `{name}`: `{token}` is not a number literal", HINT)
            if value in values:
                raise SubmissionError(f"{path}:{number}: `{name}` lists {token} twice", HINT)
            values.append(value)
        nodes = bound.get(name, [])
        if not nodes:
            raise SubmissionError(f"{path}:{number}: `{name}` is declared but never assigned at module level",
                                  f"add `{name} = {tokens[0]}` at module level; the kernel reads its value from there")
        if len(nodes) > 1:
            raise SubmissionError(f"{path}:{nodes[1].lineno}: `{name}` is bound more than once at module level "
                                  f"(also line {nodes[0].lineno}): popkit tune rewrites one assignment",
                                  f"assign `{name}` once, with a number")
        node = nodes[0]
        value_node = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        single = isinstance(node, ast.AnnAssign) or (isinstance(node, ast.Assign) and len(node.targets) == 1
                                                      and isinstance(node.targets[0], ast.Name))
        default = _literal(value_node) if single else None
        if default is None:
            raise SubmissionError(f"{path}:{node.lineno}: `{name}` must be assigned a number literal "
                                  f"(`{name} = {tokens[0]}`), not `{ast.unparse(node).strip()[:60]}`", HINT)
        parameters.append(Parameter(name, tuple(values), tuple(tokens), number, node.lineno, default,
                                    ast.get_source_segment(text, value_node) or repr(default)))
    constraints = tuple(Constraint(expr, number, path) for number, expr in constraint_lines)
    names = {p.name for p in parameters}
    for c in constraints:
        unknown = sorted(c.names - names)
        if unknown:
            raise SubmissionError(f"{path}:{c.line}: tune-if names `{unknown[0]}`, which is no tune parameter "
                                  f"(parameters: {', '.join(sorted(names))})", HINT)
    return TuneSpec(path, tuple(parameters), constraints)


def sample(points: Sequence[Mapping[str, Number]], count: int, seed: int,
           keep: Mapping[str, Number] | None = None) -> list[dict[str, Number]]:
    """`count` points drawn without replacement (seeded), `keep` among them when it is a point; grid order kept."""
    points = [dict(p) for p in points]
    if count >= len(points):
        return points
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(points)), count))
    if keep is not None and dict(keep) in points and points.index(dict(keep)) not in chosen:
        chosen.discard(max(chosen))
        chosen.add(points.index(dict(keep)))
    return [points[i] for i in sorted(chosen)]


def offsets(text: str) -> Any:
    """A function from an ast (line, column) position of `text` to its character offset (columns count UTF-8)."""
    starts = [0]
    for row in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(row))

    def offset(lineno: int, col: int) -> int:
        row = text[starts[lineno - 1]:starts[lineno]].encode("utf-8")
        return starts[lineno - 1] + len(row[:col].decode("utf-8", "replace"))

    return offset


def _value_span(text: str, line: int) -> tuple[int, int]:
    """Character offsets in `text` of the value of the module-level assignment on `line` (1-based)."""
    node = next((n for n in ast.parse(text).body if n.lineno == line and isinstance(n, (ast.Assign, ast.AnnAssign))
                 and n.value is not None), None)
    if node is None:
        raise SubmissionError(f"line {line}: the assignment popkit tune rewrites is gone", HINT)
    offset = offsets(text)
    value = node.value
    return offset(value.lineno, value.col_offset), offset(value.end_lineno, value.end_col_offset)  # type: ignore


def variant_text(text: str, spec: TuneSpec, values: Mapping[str, Number]) -> str:
    """The variant of `text` at `values` (TuneSpec.rewrite: the assignments rewritten; a Triton spec pins configs)."""
    return spec.rewrite(text, values)


def read_time_uses(text: str, names: Sequence[str]) -> dict[str, int]:
    """Parameters the file reads while it is imported (outside function bodies), with the first line.

    A value read only inside functions is read at call time: a per-shape dispatch may set it before each
    call. Default arguments and decorators run at import, so they count as import-time reads.
    """
    tree = ast.parse(text.removeprefix(BOM))
    found: dict[str, int] = {}
    wanted = set(names)

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for part in [*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d],
                         *([node.returns] if node.returns else [])]:
                visit(part)
            return
        if isinstance(node, ast.Lambda):
            for part in [*node.args.defaults, *[d for d in node.args.kw_defaults if d]]:
                visit(part)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in wanted:
            found.setdefault(node.id, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def load(path: Path | str, text: str | None = None) -> TuneSpec:
    path = Path(path)
    return parse(text if text is not None else path.read_text(encoding="utf-8"), str(path))


__all__ = ["Constraint", "Parameter", "TuneSpec", "declared", "label", "load", "offsets", "parse", "read_time_uses",
           "sample", "variant_text", "PREFIX", "MAX_GRID"]
