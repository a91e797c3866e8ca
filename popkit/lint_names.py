"""Names built at run time: fold the string a syntax-tree expression builds, without running it.

A submission can hide a word from a text search by building it from pieces (`"Str" + "eam"`,
`"".join([...])`, an f-string, `.format`, `%`, slicing, base64, rot13, `chr`, `bytes([...])`). `fold`
evaluates just those pure string operations on constants (and on names bound once to such an
expression), so the reward-hack rules can read the word that `getattr` or `import_module` will see.
"""

from __future__ import annotations

import ast
import base64
import binascii
import codecs
from typing import Union

Value = Union[str, bytes, int]
MAX_LENGTH = 10_000  # longer results are not names; folding stops there

_DECODERS = {"base64.b64decode": base64.b64decode, "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
             "base64.b32decode": base64.b32decode, "base64.b16decode": base64.b16decode,
             "base64.b85decode": base64.b85decode, "base64.a85decode": base64.a85decode,
             "bytes.fromhex": bytes.fromhex, "binascii.unhexlify": binascii.unhexlify,
             "binascii.a2b_base64": binascii.a2b_base64}
_STR_METHODS = {"lower", "upper", "capitalize", "title", "swapcase", "strip", "lstrip", "rstrip", "replace",
                "removeprefix", "removesuffix", "__add__", "join", "format", "decode", "encode"}
# Calls that assemble a string from other pieces (case changes and stripping only reshape one).
_BUILDERS = {"join", "format", "decode", "encode", "__add__", "chr", "bytes", "bytearray", "reversed", "fromhex",
             "unhexlify", "b64decode", "urlsafe_b64decode", "b32decode", "b16decode", "b85decode", "a85decode",
             "a2b_base64"}


class _Unknown(Exception):
    """The expression does not fold to a constant."""


def constant_names(tree: ast.AST) -> dict[str, ast.expr]:
    """Names bound exactly once in the file by a plain `NAME = expr` (candidates for folding)."""
    bound: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.comprehension)):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    value = node.value if isinstance(node, ast.Assign) and target is name else None
                    bound.setdefault(name.id, []).append(value)
    return {name: values[0] for name, values in bound.items() if len(values) == 1 and values[0] is not None}


def is_built(node: ast.expr) -> bool:
    """Whether an expression builds a string (concatenation, join, format, decoding, slicing, f-string)."""
    for n in ast.walk(node):
        if isinstance(n, (ast.BinOp, ast.JoinedStr)) or (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice)):
            return True
        if isinstance(n, ast.Call):
            func = n.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in _BUILDERS:
                return True
    return False


def fold(node: ast.expr, names: dict[str, ast.expr], dotted=lambda n: None) -> str | None:
    """The string `node` evaluates to, when only constants and pure string operations build it; else None.

    `names` maps names bound once to their expressions (constant_names); `dotted` resolves a call's
    function to its imported dotted name (e.g. `b64decode` -> `base64.b64decode`).
    """
    try:
        value = _Folder(names, dotted).eval(node)
    except (_Unknown, ValueError, TypeError, UnicodeError, binascii.Error, LookupError, OverflowError,
            IndexError, RecursionError):
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


class _Folder:
    def __init__(self, names: dict[str, ast.expr], dotted):
        self.names, self.dotted, self.depth = names, dotted, 0

    def eval(self, node: ast.AST) -> Value:
        self.depth += 1
        try:
            if self.depth > 50:
                raise _Unknown
            value = self._eval(node)
        finally:
            self.depth -= 1
        if isinstance(value, (str, bytes)) and len(value) > MAX_LENGTH:
            raise _Unknown
        return value

    def _eval(self, node: ast.AST) -> Value:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes, int)) and not isinstance(
                node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in self.names:
            return self.eval(self.names[node.id])
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.eval(v.value if isinstance(v, ast.FormattedValue) else v)) for v in node.values)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            base = self._sequence(node.value)
            bounds = [self.eval(b) if b is not None else None for b in (node.slice.lower, node.slice.upper,
                                                                       node.slice.step)]
            if not all(b is None or isinstance(b, int) for b in bounds):
                raise _Unknown
            return base[slice(*bounds)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self.eval(node.operand)
            if isinstance(value, int):
                return -value
        if isinstance(node, ast.Call):
            return self._call(node)
        raise _Unknown

    def _sequence(self, node: ast.AST) -> str | bytes:
        value = self.eval(node)
        if not isinstance(value, (str, bytes)):
            raise _Unknown
        return value

    def _items(self, node: ast.AST) -> list[Value]:
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.eval(e) for e in node.elts]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("reversed", "list", "tuple") and node.args:
            items = self._items(node.args[0]) if isinstance(node.args[0], (ast.List, ast.Tuple, ast.Call)) else list(
                self._sequence(node.args[0]))
            return items[::-1] if node.func.id == "reversed" else items
        return list(self._sequence(node))

    def _binop(self, node: ast.BinOp) -> Value:
        left = self.eval(node.left)
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            right = tuple(self._items(node.right)) if isinstance(node.right, ast.Tuple) else self.eval(node.right)
            return left % right
        right = self.eval(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return left + right
        if isinstance(node.op, ast.Mult):
            if isinstance(left, int) and isinstance(right, (str, bytes)):
                left, right = right, left
            if isinstance(right, int) and 0 <= right * len(left if isinstance(left, (str, bytes)) else "x") <= MAX_LENGTH:
                return left * right
        if isinstance(node.op, (ast.Add, ast.Sub)) and isinstance(left, int) and isinstance(right, int):
            return left + right if isinstance(node.op, ast.Add) else left - right
        raise _Unknown

    def _call(self, node: ast.Call) -> Value:
        func = node.func
        name = self.dotted(func) or ""
        args = node.args
        if name in _DECODERS and args:
            return _DECODERS[name](self._sequence(args[0]))
        if name == "codecs.decode" and len(args) >= 2:
            return codecs.decode(self._sequence(args[0]), str(self.eval(args[1])))
        if isinstance(func, ast.Name) and func.id == "chr" and len(args) == 1:
            return chr(int(self.eval(args[0])))
        if isinstance(func, ast.Name) and func.id in ("bytes", "bytearray") and len(args) == 1:
            return bytes(int(v) for v in self._items(args[0]))
        if isinstance(func, ast.Name) and func.id == "str" and len(args) == 1:
            return str(self.eval(args[0]))
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            base = self._sequence(func.value)
            if func.attr == "join":
                return base.join(self._items(args[0]) if args else [])
            if func.attr == "format":
                return base.format(*[self.eval(a) for a in args])
            if func.attr in ("decode", "encode"):
                encoding = str(self.eval(args[0])) if args else "utf-8"
                return codecs.decode(base, encoding) if func.attr == "decode" else codecs.encode(base, encoding)
            return getattr(base, func.attr)(*[self.eval(a) for a in args])
        raise _Unknown
