"""Fold the string a syntax-tree expression builds, without running it (for the reward-hack rules).

A submission can hide a word from a text search by building it from pieces (`"Str" + "eam"`,
`"".join([...])`, an f-string, `.format`, `%`, slicing, base64, rot13 by `codecs` or `str.translate`,
`chr` in a comprehension, `map` or a loop, `bytes([...])`). `fold` evaluates just those pure operations
on constants, on names bound to such expressions (popkit.check.names; a name bound several times is read
as each of its values by `choices`), on loops that only add to one name, and on calls of the file's own
one-line functions, so the rules can read the word that `getattr` or `import_module` will see. Every
operation is bounded (MAX_LENGTH, MAX_ITEMS, MAX_DEPTH, no decompressing codec, no huge format width): a
file that tries to make the linter build a huge value only stops the folding.
"""

from __future__ import annotations

import ast
import base64
import binascii
import codecs
import re
from typing import Any, Callable, Union

from popkit.check.names import Bindings, Thunk, appended, bind_call

Value = Union[str, bytes, int, bool, tuple]
MAX_LENGTH = 10_000  # longer results are not names; folding stops there
MAX_ITEMS = 512  # the longest sequence a loop, comprehension or map is folded over
MAX_CHOICES = 16  # a name bound more often than this is not read value by value
MAX_DEPTH = 60  # nested evaluation steps (names, calls) before folding gives up

_DECODERS = {"base64.b64decode": base64.b64decode, "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
             "base64.b32decode": base64.b32decode, "base64.b16decode": base64.b16decode,
             "base64.b85decode": base64.b85decode, "base64.a85decode": base64.a85decode,
             "base64.standard_b64decode": base64.standard_b64decode,
             "bytes.fromhex": bytes.fromhex, "binascii.unhexlify": binascii.unhexlify,
             "binascii.a2b_hex": binascii.a2b_hex, "binascii.a2b_base64": binascii.a2b_base64}
_UNSAFE_CODECS = {"zlib", "bz2"}  # decompression: a few bytes could make gigabytes
_STR_METHODS = {"lower", "upper", "capitalize", "title", "swapcase", "casefold", "strip", "lstrip", "rstrip",
                "replace", "removeprefix", "removesuffix", "__add__", "join", "format", "decode", "encode",
                "translate", "split", "rsplit", "partition", "rpartition", "splitlines"}
_LARGE_FORMAT = re.compile(r"\d{5,}")  # a width or precision this long would build a huge string
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mod: lambda a, b: a % b,
           ast.FloorDiv: lambda a, b: a // b, ast.BitXor: lambda a, b: a ^ b, ast.BitAnd: lambda a, b: a & b,
           ast.BitOr: lambda a, b: a | b}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_ITEM = "<map item>"  # the name `map` binds each item to: no Python name can clash with it
_FAILURES = (ValueError, TypeError, UnicodeError, binascii.Error, LookupError, OverflowError, IndexError,
             RecursionError, ZeroDivisionError, AttributeError, MemoryError)


class _Unknown(Exception):
    """The expression does not fold to a constant."""


def fold(node: ast.expr, names: Bindings, dotted: Callable[[ast.AST], str | None] = lambda n: None,
         env: dict | None = None) -> str | None:
    """The string `node` evaluates to, when only constants and pure string operations build it; else None.

    `names` are the file's bindings; `dotted` resolves a call's function to its imported dotted name
    (e.g. `b64decode` -> `base64.b64decode`); `env` binds names to values or Thunks first (a call's arguments).
    """
    try:
        value = _Folder(names, dotted, env or {}).eval(node)
    except (_Unknown, *_FAILURES):
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def fold_value(node: ast.expr, names: Bindings, dotted: Callable[[ast.AST], str | None] = lambda n: None,
               env: dict | None = None) -> Value | None:
    """Like fold, but any folded value (bytes stay bytes); None when it does not fold."""
    try:
        return _Folder(names, dotted, env or {}).eval(node)
    except (_Unknown, *_FAILURES):
        return None


def choices(node: ast.expr, names: Bindings, dotted: Callable[[ast.AST], str | None] = lambda n: None,
            env: dict | None = None) -> tuple[list[str], bool]:
    """Every string `node` may be, and whether some value could not be folded. A name bound several times
    (or a loop variable) is read binding by binding: any of them may be the one a call sees."""
    value = fold(node, names, dotted, env)
    if value is not None:
        return [value], False
    if isinstance(node, ast.Name) and env is not None and isinstance(env.get(node.id), Thunk):
        thunk = env[node.id]  # a parameter: what the call site passes, read the same way
        return choices(thunk.expr, names, dotted, thunk.env)
    if not isinstance(node, ast.Name) or (env is not None and node.id in env):
        return [], True
    found, unknown = [], False
    bound = names.of(node.id)
    if not bound or len(bound) > MAX_CHOICES or node.id in names.changed:
        return [], True
    for binding in bound:
        if binding.kind == "value" and binding.expr is not None:
            value = fold(binding.expr, names, dotted, env)
            found += [value] if value is not None else []
            unknown |= value is None
        elif binding.kind == "item" and binding.expr is not None:
            items = fold_value(ast.Call(ast.Name("tuple", ast.Load()), [binding.expr], []), names, dotted, env)
            strings = [v for v in items if isinstance(v, str)] if isinstance(items, tuple) else []
            found += strings
            unknown |= not isinstance(items, tuple) or len(strings) != len(items)
        else:
            unknown = True
    return found, unknown


class _Folder:
    def __init__(self, names: Bindings, dotted, env: dict):
        self.names, self.dotted, self.env, self.depth = names, dotted, env, 0

    def eval(self, node: ast.AST) -> Value:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH or not self.names.spend():
                raise _Unknown
            value = self._eval(node)
        finally:
            self.depth -= 1
        if isinstance(value, (str, bytes, tuple)) and len(value) > MAX_LENGTH:
            raise _Unknown
        if isinstance(value, int) and value.bit_length() > 4096:
            raise _Unknown
        return value

    def within(self, env: dict, node: ast.AST) -> Value:
        saved, self.env = self.env, env
        try:
            return self.eval(node)
        finally:
            self.env = saved

    def _eval(self, node: ast.AST) -> Value:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes, int)):
            return node.value
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, (ast.Tuple, ast.List)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                raise _Unknown
            return tuple(self.eval(e) for e in node.elts)
        if isinstance(node, ast.JoinedStr):
            return "".join(self._formatted(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            if isinstance(node.op, ast.USub) and isinstance(value, int):
                return -value
            if isinstance(node.op, ast.Not):
                return not value
            raise _Unknown
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
            return self._comprehension(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.IfExp):
            return self.eval(node.body if self.eval(node.test) else node.orelse)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise _Unknown

    def _name(self, name: str) -> Value:
        if name in self.env:
            value = self.env[name]
            return self.within(value.env, value.expr) if isinstance(value, Thunk) else value
        if name in self.names.accumulators:
            return self._accumulate(name)
        binding = self.names.single(name)
        if binding is None or binding.kind != "value" or binding.expr is None or name in self.names.changed:
            raise _Unknown
        return self.within({}, binding.expr)

    def _accumulate(self, name: str) -> Value:
        init, loop = self.names.accumulators[name]
        value = self.within({}, init)
        for item in self._items(loop.iter):
            env = {**self.env, **_bind(loop.target, item)}
            for stmt in loop.body:
                how, expr = appended(stmt, name)  # type: ignore[misc]
                piece = self.within(env, expr)
                if how == "append" and isinstance(value, tuple):
                    value = value + (piece,)
                elif how == "<" and type(piece) is type(value) and isinstance(value, (str, bytes)):
                    value = piece + value
                elif how == "+" and type(piece) is type(value) and isinstance(value, (str, bytes, tuple)):
                    value = value + piece
                else:
                    raise _Unknown
                if len(value) > MAX_LENGTH:
                    raise _Unknown
        return value

    def _formatted(self, part: ast.AST) -> str:
        if not isinstance(part, ast.FormattedValue):
            return str(self.eval(part))
        value = self.eval(part.value)
        spec = self.eval(part.format_spec) if part.format_spec is not None else ""
        if _LARGE_FORMAT.search(str(spec)):
            raise _Unknown
        conversion = {115: str, 114: repr, 97: ascii}.get(part.conversion)
        return format(conversion(value) if conversion else value, str(spec))

    def _items(self, node: ast.AST) -> list[Value]:
        value = self.eval(node)
        if isinstance(value, (str, bytes, tuple)):
            if len(value) > MAX_ITEMS:
                raise _Unknown
            return list(value)
        raise _Unknown

    def _comprehension(self, node: ast.ListComp | ast.GeneratorExp) -> tuple:
        out: list[Value] = []

        def run(index: int, env: dict) -> None:
            if index == len(node.generators):
                out.append(self.within(env, node.elt))
                if len(out) > MAX_ITEMS:
                    raise _Unknown
                return
            gen = node.generators[index]
            if gen.is_async:
                raise _Unknown
            for item in self.within(env, ast.Call(ast.Name("tuple", ast.Load()), [gen.iter], [])):
                inner = {**env, **_bind(gen.target, item)}
                if all(self.within(inner, cond) for cond in gen.ifs):
                    run(index + 1, inner)

        run(0, dict(self.env))
        return tuple(out)

    def _compare(self, node: ast.Compare) -> bool:
        left = self.eval(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node)
            compare = _COMPARE.get(type(op))
            if compare is None or not compare(left, right):
                return False
            left = right
        return True

    def _subscript(self, node: ast.Subscript) -> Value:
        base = self.eval(node.value)
        if not isinstance(base, (str, bytes, tuple)):
            raise _Unknown
        if isinstance(node.slice, ast.Slice):
            bounds = [self.eval(b) if b is not None else None for b in (node.slice.lower, node.slice.upper,
                                                                       node.slice.step)]
            if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds):
                raise _Unknown
            return base[slice(*bounds)]
        index = self.eval(node.slice)
        if not isinstance(index, int):
            raise _Unknown
        return base[index]

    def _binop(self, node: ast.BinOp) -> Value:
        left = self.eval(node.left)
        if isinstance(node.op, ast.Mod) and isinstance(left, (str, bytes)):
            right = self.eval(node.right)
            if _LARGE_FORMAT.search(str(left)) or any(isinstance(v, int) and abs(v) > MAX_LENGTH
                                                    for v in (right if isinstance(right, tuple) else (right,))):
                raise _Unknown
            return left % right
        right = self.eval(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right) and not isinstance(left, bool):
            return left + right
        if isinstance(node.op, ast.Mult):
            if isinstance(left, int) and isinstance(right, (str, bytes, tuple)):
                left, right = right, left
            if isinstance(right, int) and isinstance(left, (str, bytes, tuple)):
                if not 0 <= right * len(left) <= MAX_LENGTH:
                    raise _Unknown
                return left * right
            if isinstance(left, int) and isinstance(right, int):
                return left * right
        if isinstance(node.op, ast.LShift) and isinstance(left, int) and isinstance(right, int) and 0 <= right <= 64:
            return left << right
        if type(node.op) in _BINOPS and isinstance(left, int) and isinstance(right, int):
            return _BINOPS[type(node.op)](left, right)
        raise _Unknown

    # ------------------------------------------------------------------------------------- calls

    def _args(self, node: ast.Call) -> list[Value]:
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise _Unknown
        return [self.eval(a) for a in node.args]

    def _keyword(self, node: ast.Call, position: int, name: str, default: Any = None) -> Any:
        if len(node.args) > position:
            return self.eval(node.args[position])
        for keyword in node.keywords:
            if keyword.arg == name:
                return self.eval(keyword.value)
        if default is None:
            raise _Unknown
        return default

    def _call(self, node: ast.Call) -> Value:
        func = node.func
        name = self.dotted(func) or ""
        simple = func.id if isinstance(func, ast.Name) and func.id not in self.env else ""
        if name in _DECODERS and node.args:
            return _DECODERS[name](self._sequence(node.args[0]))
        if name in ("codecs.decode", "codecs.encode") and node.args:
            return _codec(self.eval(node.args[0]), str(self._keyword(node, 1, "encoding", "utf-8")),
                          name.endswith("decode"))
        if isinstance(func, ast.Call):  # codecs.getdecoder(enc)(text): (result, length consumed)
            maker = self.dotted(func.func) or ""
            if maker in ("codecs.getdecoder", "codecs.getencoder") and func.args and node.args:
                text = self.eval(node.args[0])
                return _codec(text, str(self.eval(func.args[0])), maker.endswith("decoder")), len(text)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and \
                (self.dotted(func.value.func) or "") == "codecs.lookup" and func.attr in ("decode", "encode"):
            text = self.eval(node.args[0]) if node.args else _unknown()
            return _codec(text, str(self.eval(func.value.args[0])), func.attr == "decode"), len(text)
        if simple in _BUILTIN_CALLS:
            return _BUILTIN_CALLS[simple](self, node)
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            return self._method(node, func)
        if simple in self.names.functions:
            return self._user_call(self.names.functions[simple], node)
        raise _Unknown

    def _method(self, node: ast.Call, func: ast.Attribute) -> Value:
        if isinstance(func.value, ast.Name) and func.value.id in ("str", "bytes") and func.value.id not in self.env \
                and not self.names.of(func.value.id):
            if not node.args:
                raise _Unknown
            base, args = self.eval(node.args[0]), node.args[1:]  # str.join("", parts): the method as a function
        else:
            base, args = self.eval(func.value), node.args
        if not isinstance(base, (str, bytes)) or any(isinstance(a, ast.Starred) for a in args):
            raise _Unknown
        if func.attr == "join":
            return base.join(self._items(args[0]) if args else [])  # type: ignore[arg-type]
        if func.attr == "translate":
            return base.translate(self._table(args[0]) if args else _unknown())  # type: ignore[arg-type]
        values = [self.eval(a) for a in args]
        if func.attr == "format":
            if _LARGE_FORMAT.search(str(base)) or any(isinstance(v, int) and abs(v) > MAX_LENGTH for v in values):
                raise _Unknown
            return base.format(*values)  # type: ignore[union-attr]
        if func.attr in ("decode", "encode"):
            encoding = str(values[0]) if values else str(self._keyword(node, 99, "encoding", "utf-8"))
            if func.attr == "encode" and isinstance(base, str) and _codec_name(encoding) in ("utf-8", "ascii"):
                return base.encode(encoding)
            return _codec(base, encoding, func.attr == "decode")
        result = getattr(base, func.attr)(*values)
        return tuple(result) if isinstance(result, list) else result

    def _table(self, node: ast.expr) -> dict:
        """The table of `str.maketrans(a, b[, c])` (or `bytes.maketrans`), directly or through a name."""
        if isinstance(node, ast.Name) and node.id not in self.env:
            binding = self.names.single(node.id)
            if binding is None or binding.kind != "value" or binding.expr is None:
                raise _Unknown
            node = binding.expr
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "maketrans"):
            raise _Unknown
        args = self._args(node)
        if not 2 <= len(args) <= 3:
            raise _Unknown
        if isinstance(args[0], bytes):
            return bytes.maketrans(args[0], args[1])  # type: ignore[arg-type,return-value]
        return str.maketrans(*args)  # type: ignore[arg-type]

    def _user_call(self, function: ast.AST, node: ast.Call) -> Value:
        """A call of the file's own function whose body is one `return EXPR` (or a lambda)."""
        body = function.body if isinstance(function, ast.Lambda) else _only_return(function)
        if body is None:
            raise _Unknown
        env = bind_call(function, node, self.env)
        if env is None:
            raise _Unknown
        return self.within(env, body)

    def _sequence(self, node: ast.AST) -> str | bytes:
        value = self.eval(node)
        if not isinstance(value, (str, bytes)):
            raise _Unknown
        return value

    def _map(self, node: ast.Call) -> tuple:
        if len(node.args) != 2:
            raise _Unknown
        fn, items = node.args[0], self._items(node.args[1])
        out = []
        for item in items:
            call = ast.Call(fn, [ast.Name(_ITEM, ast.Load())], [])
            if isinstance(fn, ast.Lambda):
                env = bind_call(fn, call, {**self.env, _ITEM: item})
                if env is None:
                    raise _Unknown
                out.append(self.within(env, fn.body))
            else:
                saved = self.env
                self.env = {**self.env, _ITEM: item}
                try:
                    out.append(self._call(call))
                finally:
                    self.env = saved
        return tuple(out)


def _unknown() -> Any:
    raise _Unknown


def _one(folder: _Folder, node: ast.Call) -> Value:
    if len(node.args) != 1 or node.keywords:
        raise _Unknown
    return folder.eval(node.args[0])


def _range(folder: _Folder, node: ast.Call) -> tuple:
    args = folder._args(node)
    if not 1 <= len(args) <= 3 or not all(isinstance(a, int) for a in args):
        raise _Unknown
    values = range(*args)  # type: ignore[arg-type]
    if len(values) > MAX_ITEMS:
        raise _Unknown
    return tuple(values)


def _int(folder: _Folder, node: ast.Call) -> int:
    args = folder._args(node)
    if len(args) == 2 and isinstance(args[0], (str, bytes)) and isinstance(args[1], int):
        return int(args[0], args[1])
    if len(args) == 1 and isinstance(args[0], (int, str, bytes)) and len(str(args[0])) < 100:
        return int(args[0])
    raise _Unknown


_BUILTIN_CALLS: dict[str, Callable[[_Folder, ast.Call], Value]] = {
    "chr": lambda f, n: chr(int(_one(f, n))),
    "ord": lambda f, n: ord(_one(f, n)),  # type: ignore[arg-type]
    "str": lambda f, n: str(_one(f, n)),
    "int": _int,
    "bytes": lambda f, n: bytes(int(v) for v in f._items(n.args[0])) if len(n.args) == 1 and not isinstance(
        f.eval(n.args[0]), (str, int)) else _unknown(),
    "bytearray": lambda f, n: bytes(int(v) for v in f._items(n.args[0])) if len(n.args) == 1 and not isinstance(
        f.eval(n.args[0]), (str, int)) else _unknown(),
    "tuple": lambda f, n: tuple(f._items(n.args[0])) if len(n.args) == 1 else _unknown(),
    "list": lambda f, n: tuple(f._items(n.args[0])) if len(n.args) == 1 else _unknown(),
    "reversed": lambda f, n: tuple(f._items(n.args[0]))[::-1] if len(n.args) == 1 else _unknown(),
    "sorted": lambda f, n: tuple(sorted(f._items(n.args[0]))) if len(n.args) == 1 and not n.keywords else _unknown(),
    "range": _range,
    "map": lambda f, n: f._map(n),
    "len": lambda f, n: len(_one(f, n)),  # type: ignore[arg-type]
}


def _codec_name(encoding: str) -> str:
    return codecs.lookup(encoding).name


def _codec(value: Value, encoding: str, decode: bool) -> Value:
    """codecs.decode/encode, but never a decompressing codec (a few bytes could make gigabytes)."""
    if _codec_name(encoding) in _UNSAFE_CODECS or not isinstance(value, (str, bytes)):
        raise _Unknown
    return codecs.decode(value, encoding) if decode else codecs.encode(value, encoding)


def _only_return(function: ast.AST) -> ast.expr | None:
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return body[0].value
    return None


def _bind(target: ast.AST, value: Value) -> dict:
    if isinstance(target, ast.Name):
        return {target.id: value}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, str, bytes)) \
            and len(target.elts) == len(value):
        out: dict = {}
        for sub, item in zip(target.elts, value):
            out.update(_bind(sub, item))
        return out
    raise _Unknown


__all__ = ["MAX_LENGTH", "choices", "fold", "fold_value"]
