"""`popkit tune` of a Triton kernel: the configs of its `@triton.autotune` decorator, each a variant.

A file with no `#!POPKIT tune` line whose kernels are decorated `@triton.autotune(configs=[triton.Config(...),
...], key=[...])` (or `autotune(...)` imported from triton, the configs given first or by keyword, as a list
or tuple of calls written out) is tuned over those configs: one parameter per autotuned kernel (named after
the kernel), its values the configs' positions. A variant is the file with each kernel's config list cut to
the one config chosen (`[triton.Config(...)]`), and Triton runs a one-config autotune without benchmarking
it, so the variant runs that config and nothing else; every variant is judged by popkit's run like any
submission. The value `all` is the input itself (every config, Triton picking at run time): the incumbent
the winner is confirmed against, and what is written when no single config beats it. The file written is
the input with the winner's configs pinned. A config cannot change per call (Triton's `key=` already picks
per shape at run time), so no per-shape file is composed. Config lists built by code (`configs=make()`)
cannot be read without running the file: popkit tune says so (exit 4).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Mapping

from popkit.errors import SubmissionError
from popkit.model.tunespec import BOM, Parameter, TuneSpec, declared, offsets, parse

ALL = "all"  # the input's own value: every config, Triton's autotuner picking at run time
HINT = ("write the configs in the decorator, `@triton.autotune(configs=[triton.Config({...}, num_warps=4), ...], "
        "key=[...])`, or declare `#!POPKIT tune` parameters instead")


@dataclass(frozen=True)
class Autotune:
    """One `@triton.autotune` decorator: its kernel, its configs' source, where the config list lies."""

    kernel: str
    line: int  # of the decorator
    configs: tuple[str, ...]  # each config's source, e.g. "triton.Config({'BLOCK': 64}, num_warps=4)"
    span: tuple[int, int]  # character offsets of the config list in the text (BOM removed)


def _is_autotune(node: ast.expr) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Attribute) and func.attr == "autotune" and isinstance(func.value, ast.Name)
            and func.value.id == "triton") or (isinstance(func, ast.Name) and func.id == "autotune")


def find(text: str, path: str = "submission.py") -> list[Autotune]:
    """Every `@triton.autotune` decorator of the file, in order (SubmissionError when a config list is not written
    out); [] when there is none or the file does not parse (parse() reports that)."""
    body = text.removeprefix(BOM)
    try:
        tree = ast.parse(body)
    except SyntaxError:
        return []
    offset = offsets(body)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if not _is_autotune(deco):
                continue
            call: ast.Call = deco  # type: ignore[assignment]
            configs = next((k.value for k in call.keywords if k.arg == "configs"), call.args[0] if call.args else None)
            where = f"{path}:{deco.lineno}"
            if not isinstance(configs, (ast.List, ast.Tuple)) or not configs.elts:
                raise SubmissionError(f"{where}: the configs of {node.name}'s @triton.autotune are not a list "
                                      "popkit can read without running the file", HINT)
            if any(isinstance(e, ast.Starred) for e in configs.elts):
                raise SubmissionError(f"{where}: {node.name}'s config list unpacks another (`*`)", HINT)
            sources = tuple(ast.get_source_segment(body, e) or "" for e in configs.elts)
            span = (offset(configs.lineno, configs.col_offset),
                    offset(configs.end_lineno, configs.end_col_offset))  # type: ignore[arg-type]
            found.append(Autotune(node.name, deco.lineno, sources, span))
    return sorted(found, key=lambda a: a.span)


@dataclass(frozen=True)
class TritonSpec(TuneSpec):
    """A TuneSpec over autotune configs: one parameter per kernel, values the configs' positions (ALL: the input)."""

    autotunes: tuple[Autotune, ...] = ()

    def allows(self, values: Mapping[str, Any]) -> bool:
        return all(values.get(a.kernel) in range(len(a.configs)) for a in self.autotunes)

    def token(self, name: str, value: Any) -> str:
        autotune = next(a for a in self.autotunes if a.kernel == name)
        return f"[{autotune.configs[value]}]" if value != ALL else ""

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": a.kernel, "values": list(range(len(a.configs))), "default": ALL, "line": a.line,
                 "configs": list(a.configs)} for a in self.autotunes]

    @property
    def per_call(self) -> bool:
        return False

    def rewrite(self, text: str, values: Mapping[str, Any]) -> str:
        """The file with each kernel's config list cut to the config `values` names (ALL or missing: kept)."""
        bom = BOM if text.startswith(BOM) else ""
        body = text.removeprefix(BOM)
        for autotune in sorted(self.autotunes, key=lambda a: a.span, reverse=True):
            value = values.get(autotune.kernel, ALL)
            if value != ALL:
                start, end = autotune.span
                body = body[:start] + self.token(autotune.kernel, value) + body[end:]
        return bom + body


def spec_for(text: str, path: str = "submission.py") -> TuneSpec:
    """The file's `#!POPKIT tune` spec, or, without such lines, its `@triton.autotune` configs as one."""
    if not declared(text):
        found = find(text, path)
        if found:
            kernels = [a.kernel for a in found]
            twice = next((k for k in kernels if kernels.count(k) > 1), None)
            if twice:
                raise SubmissionError(f"{path}: two @triton.autotune kernels are named {twice}", HINT)
            parameters = tuple(Parameter(a.kernel, tuple(range(len(a.configs))), a.configs, a.line, 0, ALL, ALL)
                               for a in found)  # type: ignore[arg-type]
            return TritonSpec(path, parameters, (), tuple(found))
    return parse(text, path)


def config_notes(spec: TuneSpec) -> list[str]:
    """What each value of a Triton spec means, for the report (none for a `#!POPKIT tune` spec)."""
    if not isinstance(spec, TritonSpec):
        return []
    return [f"{a.kernel}={i}: {config}" for a in spec.autotunes for i, config in enumerate(a.configs)]


__all__ = ["ALL", "Autotune", "TritonSpec", "config_notes", "find", "spec_for"]
