"""Calls that reach an attribute or a module by a name given as a value, however they are spelled.

`getattr(obj, NAME)` is the plain form. The same reach hides behind an alias (`ga = getattr`,
`builtins.getattr`), a `functools.partial`, a namespace lookup (`vars(m)[NAME]`, `m.__dict__.get(NAME)`,
`sys.modules.get(NAME)`) and behind the file's own functions that hand a parameter on to one of those
(`def get(o, n): return getattr(o, n)`, called elsewhere with the built name). `Reach` finds all of them
and, for a call of such a function, binds its parameters to the call's arguments so that the name can be
folded where it is built.
"""

from __future__ import annotations

import ast
from typing import Callable

from popkit.check.names import Bindings, bind_call

# Calls that reach an attribute or a module by a name given as a value: the index of that argument.
REACH = {"getattr": 1, "setattr": 1, "hasattr": 1, "delattr": 1, "inspect.getattr_static": 1,
         "operator.attrgetter": 0, "operator.methodcaller": 0, "_operator.attrgetter": 0,
         "_operator.methodcaller": 0, "importlib.import_module": 0, "__import__": 0, "importlib.__import__": 0,
         "importlib.util.find_spec": 0, "pkgutil.resolve_name": 0, "object.__getattribute__": 1,
         "type.__getattribute__": 1}
MODULE_REACH = {"importlib.import_module", "__import__", "importlib.__import__", "pkgutil.resolve_name"}
NAMESPACES = {"vars", "globals", "locals"}  # vars(x)[name]: the same reach as getattr(x, name)
_LOOKUPS = {"get", "pop", "setdefault", "__getitem__"}  # a namespace's methods that take a name
MAX_INLINE = 4  # how deep calls of the file's own functions are followed
MAX_INLINED = 32  # names one call hands on that are followed


class Reach:
    """The reach calls of one file. `dotted` resolves a call's function to its imported dotted name."""

    def __init__(self, tree: ast.AST, names: Bindings, dotted: Callable[[ast.AST], str | None]):
        self.names, self.dotted = names, dotted
        self._calls: dict[int, list[ast.Call]] = {}
        self.partials: dict[str, tuple[str, int]] = {}  # p = partial(getattr, obj): p -> ("getattr", 1)
        for name in list(names.names):
            binding = names.single(name)
            if binding is not None and binding.kind == "value" and isinstance(binding.expr, ast.Call):
                found = self._partial(binding.expr)
                if found is not None:
                    self.partials[name] = found
        self.reaching = self._reaching()

    def _partial(self, call: ast.Call) -> tuple[str, int] | None:
        if (self.dotted(call.func) or "") != "functools.partial" or not call.args:
            return None
        target = self.dotted(call.args[0]) or ""
        if target not in REACH:
            return None
        return target, len(call.args) - 1

    def key(self, call: ast.Call) -> tuple[ast.expr, str] | None:
        """The name argument of a reach call, and how the call is spelled; None for any other call."""
        name = self.dotted(call.func) or ""
        args = call.args
        if name in REACH and len(args) > REACH[name]:
            return args[REACH[name]], name
        if name.endswith("__getattribute__") and args:
            return args[-1], name
        if name == "functools.partial" and args:
            target = self.dotted(args[0]) or ""
            if target in REACH and len(args) > REACH[target] + 1:
                return args[REACH[target] + 1], f"functools.partial({target})"
        if isinstance(call.func, ast.Name) and call.func.id in self.partials:
            target, bound = self.partials[call.func.id]
            if len(args) > REACH[target] - bound >= 0:
                return args[REACH[target] - bound], f"{call.func.id} (functools.partial of {target})"
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in _LOOKUPS and args and self.namespace(func.value):
            return args[0], f"{ast.unparse(func.value)}.{func.attr}"
        return None

    def namespace(self, node: ast.AST) -> bool:
        """vars(x), globals(), locals(), x.__dict__ or sys.modules: a mapping from names to objects."""
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return True
        if isinstance(node, ast.Call) and (self.dotted(node.func) or "") in NAMESPACES:
            return True
        return (self.dotted(node) or "") == "sys.modules"

    def _calls_in(self, function: ast.AST) -> list[ast.Call]:
        """The calls in a function's body that reach, or call the file's functions (computed once)."""
        cached = self._calls.get(id(function))
        if cached is None:
            body = [function.body] if isinstance(function, ast.Lambda) else function.body
            cached = [n for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Call) and (
                self.key(n) is not None or (isinstance(n.func, ast.Name) and n.func.id in self.names.functions))]
            self._calls[id(function)] = cached
        return cached

    def _reaching(self) -> set[str]:
        """The file's functions that hand a value on to a reach call, directly or through each other."""
        reaching: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, function in self.names.functions.items():
                if name in reaching:
                    continue
                for call in self._calls_in(function):
                    callee = call.func.id if isinstance(call.func, ast.Name) else ""
                    if self.key(call) is not None or callee in reaching:
                        reaching.add(name)
                        changed = True
                        break
        return reaching

    def inlined(self, call: ast.Call, env: dict | None = None,
                depth: int = 0) -> list[tuple[ast.expr, dict, str, str]]:
        """For a call of the file's own function that reaches: each name it hands on that depends on the
        function's parameters, with the environment binding them to this call's arguments (to fold it),
        the reach's spelling and the function it is in."""
        callee = call.func.id if isinstance(call.func, ast.Name) else ""
        if callee not in self.reaching or depth >= MAX_INLINE:
            return []
        function = self.names.functions[callee]
        inner_calls = self._calls_in(function)
        bound = bind_call(function, call, env or {})
        if bound is None or not self.names.spend(10 * len(inner_calls)):
            return []
        found: list[tuple[ast.expr, dict, str, str]] = []
        for inner in inner_calls:
            if len(found) >= MAX_INLINED:
                break
            key = self.key(inner)
            if key is None:
                found += [(expr, env, spelled, via or callee) for expr, env, spelled, via in
                          self.inlined(inner, bound, depth + 1)]
            elif any(isinstance(n, ast.Name) and n.id in bound for n in ast.walk(key[0])):
                found.append((key[0], bound, key[1], callee))  # a name this call decides
        return found


__all__ = ["MODULE_REACH", "NAMESPACES", "REACH", "Reach"]
