"""What a task's `generate_input` (its reference.py) returns, read from the source without running it.

`popkit new` renders a skeleton's unpacking of `data` from this before task.py's `input_t` annotation:
the annotation is documentation and can be wrong (pmpp_v2's vectoradd annotates two tensors, while
generate_input returns A, B and a preallocated output, all float16), and `data` is what generate_input
returns. Only a plain `return a, b, c` (or `return x`) of names bound in the function to a torch factory
call (`torch.randn(..., dtype=torch.float16)`, optionally followed by methods such as `.contiguous()`) is
read; anything else answers None, and the caller says it could not tell.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

_FACTORIES = {"empty", "zeros", "ones", "randn", "rand", "full", "randint", "empty_like", "zeros_like", "ones_like",
              "randn_like", "rand_like", "tensor", "arange", "normal", "empty_strided"}
_DEFAULT_DTYPE = {"randint": "int64", "arange": "int64"}  # torch's default dtype for these, without dtype=


@dataclass(frozen=True)
class Returned:
    """One value generate_input returns: its name there, and its dtype when it is a tensor popkit could read."""

    name: str
    dtype: str | None  # float16, float32, ...; None: not a tensor from a torch factory (or its dtype unknown)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _factory_dtype(value: ast.AST) -> str | None:
    """The dtype of `torch.F(..., dtype=torch.D)` with methods chained after it; None when not such a call."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not \
            _dotted(value.func).startswith("torch."):
        value = value.func.value  # x.contiguous(), x.to(...): the call it was made on
    if not isinstance(value, ast.Call) or not _dotted(value.func).startswith("torch."):
        return None
    name = _dotted(value.func).rsplit(".", 1)[-1]
    if name not in _FACTORIES:
        return None
    for kw in value.keywords:
        if kw.arg == "dtype":
            dotted = _dotted(kw.value)
            return dotted.rsplit(".", 1)[-1] if dotted.startswith("torch.") else None
    return _DEFAULT_DTYPE.get(name, "float32")


def generated_inputs(reference: Path) -> list[Returned] | None:
    """The values `generate_input` returns, in order; None when reference.py is unreadable or the return is not
    a plain name or tuple of names."""
    try:
        tree = ast.parse(Path(reference).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "generate_input"), None)
    if func is None:
        return None
    bound: dict[str, str | None] = {}
    returns = []
    for node in sorted((n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.Return))), key=lambda n: n.lineno):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            bound[node.targets[0].id] = _factory_dtype(node.value)
        elif isinstance(node, ast.Return) and node.value is not None:
            returns.append(node.value)
    returned = returns[-1] if returns else None  # the last return in source order
    if isinstance(returned, ast.Name):
        names = [returned]
    elif isinstance(returned, ast.Tuple) and all(isinstance(e, ast.Name) for e in returned.elts):
        names = list(returned.elts)
    else:
        return None
    return [Returned(n.id, bound.get(n.id)) for n in names]  # type: ignore[attr-defined]
