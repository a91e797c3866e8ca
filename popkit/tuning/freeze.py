"""The file `popkit tune` writes: the winner's values frozen into a plain submission.

One winner: the input with the values written into its assignments and a comment saying what was chosen
(`frozen_text`); its `#!POPKIT tune` lines stay, so the output can be tuned again. Where the best values
differ by benchmark shape and the values are read at call time (`tunespec.read_time_uses` finds no read at
import), `per_shape_text` adds a dispatch: custom_kernel looks the input's tensor shapes up in a table
written here and sets the values before calling the original; any other shape keeps the overall winner's.
A lookup, not a measurement: nothing is tuned while the eval runs. Its `#!POPKIT` lines become plain
comments, since rewriting the assignments would no longer change what runs.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

from popkit.model.tunespec import BOM, Number, TuneSpec, variant_text

FORBIDDEN = "str" + "eam"  # the server refuses any file containing it (docs/protocol-notes.md §6)
_POPKIT_LINE = re.compile(r"^(\s*)#!POPKIT\b\s*(.*)$")
Shapes = tuple[tuple[int, ...], ...]  # the shapes of the tensors in one input, in order


def _safe(comment: str) -> str:
    """A comment line popkit adds must never hold the word the server refuses, nor read as an encoding declaration
    (PEP 263: `coding:` or `coding=` in a comment on line 1 or 2, e.g. a Triton kernel named `decoding`)."""
    return re.sub(r"coding([:=])", r"coding \1", re.sub(FORBIDDEN, "s-tream", comment, flags=re.IGNORECASE))


def _insert_after_declarations(text: str, lines: Sequence[str]) -> str:
    """`lines` (comments) right after the last `#!POPKIT` line, so they stay in the file's leading comment block
    when the declarations are there."""
    bom = BOM if text.startswith(BOM) else ""
    rows = text.removeprefix(BOM).splitlines(keepends=True)
    last = max((i for i, row in enumerate(rows) if _POPKIT_LINE.match(row)), default=-1)
    newline = "\r\n" if rows and rows[0].endswith("\r\n") else "\n"
    added = [_safe(line) + newline for line in lines]
    return bom + "".join(rows[:last + 1] + added + rows[last + 1:])


def frozen_text(text: str, spec: TuneSpec, values: Mapping[str, Number], summary: str) -> str:
    """The input with `values` in its assignments and `# popkit tune: SUMMARY` below its declarations."""
    return _insert_after_declarations(variant_text(text, spec, values), [f"# popkit tune: {summary}"])


def _literal(spec: TuneSpec, values: Mapping[str, Number]) -> str:
    return "{" + ", ".join(f'"{name}": {spec.token(name, values[name])}' for name in spec.names) + "}"


def per_shape_text(text: str, spec: TuneSpec, default: Mapping[str, Number],
                   table: Sequence[tuple[Shapes, Mapping[str, Number], str]], summary: str) -> str:
    """The input with `default` frozen and a dispatch on the input's tensor shapes: `table` rows are
    (shapes, values, the benchmark spec they were timed on)."""
    body = _insert_after_declarations(variant_text(text, spec, default), [f"# popkit tune: {summary}"])
    rows = []
    for row in body.removeprefix(BOM).splitlines(keepends=True):
        match = _POPKIT_LINE.match(row)
        if match:  # a declaration would promise that rewriting the assignment changes what runs; it no longer does
            ending = "\r\n" if row.endswith("\r\n") else "\n" if row.endswith("\n") else ""
            row = f"{match.group(1)}# tuned per shape by popkit tune: {match.group(2)}{ending}"
        rows.append(row)
    body = (BOM if text.startswith(BOM) else "") + "".join(rows)
    names = ", ".join(spec.names)
    entries = "\n".join(f"    {shapes!r}: {_literal(spec, values)},  # {_safe(case)}" for shapes, values, case in table)
    sets = ", ".join(f'values["{name}"]' for name in spec.names)
    tail = f'''

# Written by `popkit tune`: the values that timed best for each benchmark input, by the shapes of its
# tensors; any other input keeps the values assigned above. A lookup at each call: nothing is tuned while
# the eval runs.
_POPKIT_BY_SHAPE = {{
{entries}
}}
_POPKIT_DEFAULT = {_literal(spec, default)}
_popkit_tuned_kernel = custom_kernel


def _popkit_shapes(data):
    """The shapes of the tensors in `data` (nested tuples, lists and dict values), in order."""
    if hasattr(data, "shape") and hasattr(data, "dtype"):
        return (tuple(data.shape),)
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        return tuple(shape for item in data for shape in _popkit_shapes(item))
    return ()


def custom_kernel(data):
    global {names}
    values = _POPKIT_BY_SHAPE.get(_popkit_shapes(data), _POPKIT_DEFAULT)
    {names} = {sets}
    return _popkit_tuned_kernel(data)
'''
    return body.rstrip("\r\n") + "\n" + tail


__all__ = ["frozen_text", "per_shape_text", "Shapes"]
