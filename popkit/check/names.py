"""Where the names of a file get their values: the bindings the name folder (popkit.check.fold) reads.

Every binding of every name in the file is kept, scopes merged (a name means all its bindings): plain
assignments, loop and comprehension targets, `+=`, function parameters, imports. Loops that only add to
one name (`for c in codes: name += chr(c)`) are recognised so that the folder can run them; a list
changed in place, or handed to a call that might change it, is marked as such. `is_built` says whether an
expression builds a string, itself or through any binding of a name it reads, so that a rule can warn
where the folder cannot fold.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

_BINDERS = {ast.Assign, ast.AnnAssign, ast.NamedExpr, ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension,
            ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Import, ast.ImportFrom, ast.With,
            ast.AsyncWith, ast.ExceptHandler, ast.Global, ast.Nonlocal, ast.Delete, ast.Call}
STEPS = 2_000_000  # evaluation steps the folder may take on one file, whatever the file holds

# Calls that assemble a string from other pieces (case changes and stripping only reshape one).
_BUILDERS = {"join", "format", "decode", "encode", "__add__", "chr", "bytes", "bytearray", "reversed", "fromhex",
             "unhexlify", "a2b_hex", "b64decode", "urlsafe_b64decode", "standard_b64decode", "b32decode",
             "b16decode", "b85decode", "a85decode", "a2b_base64", "translate", "maketrans", "map",
             "getdecoder", "getencoder", "lookup", "iterdecode", "iterencode"}
# str methods that reshape a string: built when the string they are called on is.
_STR_METHODS = {"lower", "upper", "capitalize", "title", "swapcase", "casefold", "strip", "lstrip", "rstrip",
                "replace", "removeprefix", "removesuffix", "split", "rsplit", "partition", "rpartition"}
# Methods that change a list, dict, set or bytearray in place: a name they are called on is built.
_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort", "update", "add",
             "setdefault", "popitem", "discard", "__setitem__", "__delitem__", "__iadd__"}
# Calls that read a sequence without changing it: passing a list to anything else may change it.
_PURE = {"join", "str", "bytes", "tuple", "list", "len", "map", "reversed", "sorted", "bytearray", "format",
         "getattr", "hasattr", "setattr", "delattr", "print", "isinstance", "zip", "enumerate", "range", "any",
         "all", "min", "max", "sum", "iter", "next", "frozenset", "set", "dict", "repr", "ord", "chr"}

@dataclass(frozen=True)
class Binding:
    """One way a name gets a value: `value` (NAME = expr), `item` (a for or comprehension target over
    `expr`), `aug` (NAME += expr), `param` (a parameter of `function`) or `opaque` (import, def, with...)."""

    kind: str
    expr: ast.expr | None = None
    function: ast.AST | None = None


@dataclass
class Bindings:
    """Every binding of every name in one file. Scopes are merged: a name means all its bindings."""

    names: dict[str, list[Binding]] = field(default_factory=dict)
    tree: ast.AST | None = None
    nodes: list[ast.AST] = field(default_factory=list)  # every node of the tree, in ast.walk order
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda] = field(default_factory=dict)
    accumulators: dict[str, tuple[ast.expr, ast.For]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # lists and the like changed in place or handed on
    handed: set[str] = field(default_factory=set)  # names passed to a call that might change what they hold
    budget: list[int] = field(default_factory=lambda: [STEPS])  # folding steps left for the whole file

    def spend(self, steps: int = 1) -> bool:
        """Take steps from the file's budget; False once it is spent (folding then gives up, which
        leaves warnings, not silence)."""
        self.budget[0] -= steps
        return self.budget[0] >= 0

    def of(self, name: str) -> list[Binding]:
        return self.names.get(name, [])

    def single(self, name: str) -> Binding | None:
        found = self.of(name)
        return found[0] if len(found) == 1 else None


def bindings(tree: ast.AST) -> Bindings:
    """The Bindings of a parsed file."""
    found = Bindings(tree=tree)

    def add(name: str, binding: Binding) -> None:
        found.names.setdefault(name, []).append(binding)

    def bind_target(target: ast.AST, value: ast.expr | None, kind: str = "value") -> None:
        if isinstance(target, ast.Name):
            add(target.id, Binding(kind, value) if value is not None else Binding("opaque"))
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if kind == "value" and isinstance(value, (ast.Tuple, ast.List)) else None
            if values is not None and len(values) == len(target.elts) and not any(
                    isinstance(e, ast.Starred) for e in target.elts + values):
                for sub, sub_value in zip(target.elts, values):
                    bind_target(sub, sub_value)
            else:
                for sub in target.elts:
                    bind_target(sub.value if isinstance(sub, ast.Starred) else sub, None)
        elif isinstance(target, ast.Starred):
            bind_target(target.value, None)
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            found.changed.add(target.value.id)

    found.nodes = list(ast.walk(tree))
    for node in found.nodes:
        if type(node) not in _BINDERS:
            continue  # most nodes are names, constants and operators: one set lookup passes them
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind_target(target, node.value)
        elif isinstance(node, ast.AnnAssign):
            bind_target(node.target, node.value)
        elif isinstance(node, ast.NamedExpr):
            bind_target(node.target, node.value)
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name):
                add(node.target.id, Binding("aug", node.value))
            else:
                bind_target(node.target, None)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            if isinstance(node.target, ast.Name):
                add(node.target.id, Binding("item", node.iter))
            else:
                bind_target(node.target, None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
                add(arg.arg, Binding("param", function=node))
            if not isinstance(node, ast.Lambda):
                add(node.name, Binding("opaque", function=node))
        elif isinstance(node, ast.ClassDef):
            add(node.name, Binding("opaque"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                add((alias.asname or alias.name).split(".")[0], Binding("opaque"))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    bind_target(item.optional_vars, None)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            add(node.name, Binding("opaque"))
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                add(name, Binding("opaque"))
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                bind_target(target, None)
        elif isinstance(node, ast.Call):
            _note_change(node, found)
    for name in found.handed:  # a string or a number handed on stays what it is; a list may not
        if any(b.kind == "value" and _mutable(b.expr) for b in found.of(name)):
            found.changed.add(name)
    for name, bound in found.names.items():
        if len(bound) == 1 and bound[0].function is not None and bound[0].kind == "opaque":
            found.functions[name] = bound[0].function  # type: ignore[assignment]
        elif len(bound) == 1 and bound[0].kind == "value" and isinstance(bound[0].expr, ast.Lambda):
            found.functions[name] = bound[0].expr
    for node in found.nodes:
        if isinstance(node, (ast.stmt, ast.Module)):
            for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
                if isinstance(body, list) and any(isinstance(b, ast.For) for b in body):
                    _find_accumulators(body, found)
    return found


def _mutable(expr: ast.expr | None) -> bool:
    """A list, dict, set or bytearray (a display, a comprehension or a constructor call)."""
    if isinstance(expr, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    return isinstance(expr, ast.Call) and getattr(expr.func, "id", "") in ("list", "dict", "set", "bytearray")


def _note_change(call: ast.Call, found: Bindings) -> None:
    """A list changed in place (`parts.append(x)`) or handed to a call that might change it."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr in _MUTATORS:
        found.changed.add(func.value.id)
    callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if callee not in _PURE:
        for arg in list(call.args) + [k.value for k in call.keywords]:
            if isinstance(arg, ast.Name):
                found.handed.add(arg.id)


def appended(stmt: ast.stmt, name: str) -> tuple[str, ast.expr] | None:
    """How a loop body statement adds to `name`: ("+", x) for `name += x` or `name = name + x`, ("<", x)
    for `name = x + name`, ("append", x) for `name.append(x)`; None for anything else."""
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name) \
            and stmt.target.id == name:
        return "+", stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
            and stmt.targets[0].id == name and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add):
        left, right = stmt.value.left, stmt.value.right
        if isinstance(left, ast.Name) and left.id == name:
            return "+", right
        if isinstance(right, ast.Name) and right.id == name:
            return "<", left
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute) \
            and stmt.value.func.attr == "append" and isinstance(stmt.value.func.value, ast.Name) \
            and stmt.value.func.value.id == name and len(stmt.value.args) == 1:
        return "append", stmt.value.args[0]
    return None


def _added_to(stmt: ast.stmt) -> str | None:
    """The one name a loop body statement adds to (see appended), or None."""
    for node in (getattr(stmt, "target", None), *getattr(stmt, "targets", ()),
                 getattr(getattr(getattr(stmt, "value", None), "func", None), "value", None)):
        if isinstance(node, ast.Name) and appended(stmt, node.id):
            return node.id
    return None


def _find_accumulators(body: list[ast.stmt], found: Bindings) -> None:
    """`NAME = INIT` followed in the same block by `for T in ITER:` whose body only adds to NAME."""
    loops: dict[str, list[tuple[int, ast.For]]] = {}
    for j, stmt in enumerate(body):
        if isinstance(stmt, ast.For) and not stmt.orelse and stmt.body:
            names = {_added_to(b) for b in stmt.body}
            if len(names) == 1 and None not in names:
                loops.setdefault(names.pop(), []).append((j, stmt))  # type: ignore[arg-type]
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        after = [loop for j, loop in loops.get(name, []) if j > i]
        if len(after) != 1:
            continue
        loop = after[0]
        inside = sum(1 for b in loop.body if appended(b, name)[0] != "append")  # type: ignore[index]
        # Its only bindings are the one before the loop and those in the loop's body.
        if len(found.of(name)) == 1 + inside:
            found.accumulators[name] = (stmt.value, loop)


def is_built(node: ast.expr, names: Bindings, env: dict | None = None, _seen: set[str] | None = None) -> bool:
    """Whether an expression builds a string (concatenation, join, format, decoding, slicing, f-string, a
    comprehension, `map`), itself or through any binding of a name whose value it is. A name read for an
    attribute (`field.name`) or called is not followed: what it holds is not the value."""
    seen = set() if _seen is None else _seen
    followed: list[ast.Name] = []

    def walk(n: ast.AST) -> bool:
        if isinstance(n, (ast.BinOp, ast.JoinedStr, ast.ListComp, ast.GeneratorExp, ast.SetComp)) or (
                isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice)):
            return True
        if isinstance(n, ast.Call):
            func = n.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in _BUILDERS:
                return True
            return any(walk(a) for a in list(n.args) + [k.value for k in n.keywords]) or (
                isinstance(func, ast.Attribute) and walk(func.value) and func.attr in _STR_METHODS)
        if isinstance(n, ast.Attribute):
            return False
        if isinstance(n, ast.Name):
            followed.append(n)
            return False
        return any(walk(child) for child in ast.iter_child_nodes(n))

    if walk(node):
        return True
    for n in followed:
        if not isinstance(n.ctx, ast.Load) or n.id in seen:
            continue
        seen.add(n.id)
        if env is not None and n.id in env:
            thunk = env[n.id]
            if isinstance(thunk, Thunk) and is_built(thunk.expr, names, thunk.env, seen):
                return True
            continue
        if n.id in names.changed or n.id in names.accumulators:
            return True
        for binding in names.of(n.id):
            if binding.kind == "aug" or (binding.expr is not None and is_built(binding.expr, names, None, seen)):
                return True
    return False


@dataclass(frozen=True)
class Thunk:
    """An expression to evaluate in the environment it was written in (a call's argument)."""

    expr: ast.expr
    env: dict


def bind_call(function: ast.AST, call: ast.Call, env: dict) -> dict | None:
    """The parameters of `function` bound to the arguments of `call` (as Thunks in `env`), with defaults;
    None when the call cannot be matched (a star argument, an unknown keyword)."""
    args = function.args  # type: ignore[attr-defined]
    positional = args.posonlyargs + args.args
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    bound: dict = {}
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(args.defaults):], args.defaults))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
    for name, default in defaults.items():
        bound[name] = Thunk(default, {})
    for param, arg in zip(positional, call.args):
        bound[param.arg] = Thunk(arg, env)
    if len(call.args) > len(positional) and args.vararg is None:
        return None
    names = {a.arg for a in positional + args.kwonlyargs}
    for keyword in call.keywords:
        if keyword.arg not in names:
            return None
        bound[keyword.arg] = Thunk(keyword.value, env)
    return bound


def aliases(names: Bindings) -> dict[str, str]:
    """Local name -> dotted name: imports (`import numpy as np`), and names bound once to another name or
    attribute (`ga = getattr`, `cuda = torch.cuda`), so that a rule sees through the new name."""
    found: dict[str, str] = {}
    for node in names.nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                found[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                found[a.asname or a.name] = f"{node.module}.{a.name}"

    def resolve(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return found.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for _ in range(3):  # a chain of such names: `g = getattr; h = g`
        for name, bound in names.names.items():
            expr = bound[0].expr if len(bound) == 1 and bound[0].kind == "value" else None
            root = expr
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(expr, (ast.Name, ast.Attribute)) and isinstance(root, ast.Name) and root.id != name:
                target = resolve(expr)
                if target:
                    found[name] = target
    return found


__all__ = ["Binding", "Bindings", "Thunk", "aliases", "appended", "bind_call", "bindings", "is_built"]
