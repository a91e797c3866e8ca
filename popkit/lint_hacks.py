"""Static reward-hack rules for Python submissions, read from the syntax tree.

Each rule names the class of cheat it catches (the README's "Trust" section lists the classes): timer
or synchronize patching, harness or evaluator tampering, writes to file descriptors, `sys.modules`
surgery, frame walking, runtime package installs, `exec` of built strings, output caches keyed on
`data_ptr()`/`id()`, and threads or processes started at import or inside `custom_kernel`. The tree is
used rather than text so that comments, docstrings and kernel source strings don't trigger rules.
"""

from __future__ import annotations

import ast
import re

from popkit.diagnostics import ERROR, WARNING, Diagnostic, finding
from popkit.lint_names import constant_names, fold, is_built

ENTRY = "custom_kernel"

# Attributes no kernel has a reason to assign, whatever object they hang on.
_TIMER_ALWAYS = {"elapsed_time", "synchronize", "perf_counter", "perf_counter_ns", "monotonic",
                 "monotonic_ns", "process_time", "process_time_ns"}
_HARNESS_MODULES = {"eval", "popkit_eval"}
_HARNESS_NAMES = {"check_implementation", "ref_kernel", "generate_input"}
_FD_CALLS = {"os.write", "os.writev", "os.pwrite", "os.fdopen", "os.dup", "os.dup2", "os.sendfile",
             "os.openpty", "io.FileIO"}
_FRAME_CALLS = {"sys._getframe", "sys._current_frames", "inspect.currentframe", "inspect.stack",
                "inspect.getouterframes", "inspect.getinnerframes", "inspect.trace", "gc.get_objects",
                "gc.get_referrers", "gc.get_referents", "traceback.walk_stack"}
_FRAME_ATTRS = {"f_back", "f_globals", "f_locals", "f_builtins", "tb_frame", "gi_frame", "cr_frame"}
_SHELL_CALLS = {"subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
                "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput", "os.system",
                "os.popen", "os.execv", "os.execvp", "os.execl", "os.execlp", "os.spawnv", "os.spawnl"}
_MODULES_MUTATORS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__"}
_CONCURRENCY = {"threading.Thread", "threading.Timer", "_thread.start_new_thread", "_thread.start_new",
                "multiprocessing.Process", "multiprocessing.Pool", "multiprocessing.pool.Pool",
                "multiprocessing.pool.ThreadPool", "concurrent.futures.ThreadPoolExecutor",
                "concurrent.futures.ProcessPoolExecutor", "os.fork", "torch.multiprocessing.spawn",
                "torch.multiprocessing.Process"}
_CACHE_DECORATORS = {"functools.lru_cache", "functools.cache"}
_INSTALL = re.compile(r"\b(pip3?|conda|mamba|uv)\b.*\binstall\b")
_TENSOR_HOOKS = {"__torch_function__", "__torch_dispatch__"}
_CONTAINERS = {"dict", "list", "set", "collections.defaultdict", "collections.OrderedDict", "defaultdict",
               "OrderedDict"}
_LOOKUP_METHODS = {"get", "setdefault", "pop", "__getitem__", "__contains__"}
# Calls that reach an attribute or a module by a name given as a value: the index of that argument.
_NAME_ARG = {"getattr": 1, "setattr": 1, "hasattr": 1, "delattr": 1, "inspect.getattr_static": 1,
             "operator.attrgetter": 0, "operator.methodcaller": 0, "importlib.import_module": 0, "__import__": 0,
             "importlib.util.find_spec": 0}
_NAMESPACES = {"vars", "globals", "locals"}  # vars(x)[name]: the same reach as getattr(x, name)
# Names a submission has no reason to build from pieces: what the other rules guard, by its last part.
_GUARDED = {
    **dict.fromkeys(_TIMER_ALWAYS | {"Event", "record"}, "a timer the harness uses"),
    **dict.fromkeys(_HARNESS_NAMES | _HARNESS_MODULES, "part of the evaluator"),
    **dict.fromkeys(_FRAME_ATTRS | {c.rsplit(".", 1)[1] for c in _FRAME_CALLS}, "interpreter frames"),
    **dict.fromkeys({c.rsplit(".", 1)[1] for c in _FD_CALLS}, "a raw file descriptor"),
    **dict.fromkeys({"modules", "system", "popen", "Popen", "exec", "eval", "__import__", "check_output"},
                    "the module table, a shell or generated code"),
}


def guarded_name(name: str) -> str | None:
    """Why a name (an attribute, or a dotted module path) is one the rules guard, or None."""
    if "str" + "eam" in name.lower():
        return "the server refuses that word"
    parts = name.split(".")
    return _GUARDED.get(parts[-1]) or (_GUARDED.get(parts[0]) if parts[0] in _HARNESS_MODULES else None)


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


class _HackVisitor(ast.NodeVisitor):
    def __init__(self, aliases: dict[str, str], docstrings: set[int], names: dict[str, ast.expr]):
        self.aliases = aliases  # local name -> what it was imported as (dotted)
        self.docstrings = docstrings  # id() of docstring constants: prose, not code
        self.names = names  # names bound once, for folding built strings (lint_names.constant_names)
        self.functions: list[str] = []
        self.in_main_guard = False
        self.found: list[Diagnostic] = []

    # --------------------------------------------------------------------------- helpers

    def add(self, rule: str, severity: str, node: ast.AST, message: str, hint: str) -> None:
        self.found.append(finding(rule, severity, getattr(node, "lineno", None),
                                  getattr(node, "col_offset", -1) + 1 if hasattr(node, "col_offset") else None,
                                  message, hint))

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def in_entry(self) -> bool:
        return ENTRY in self.functions

    def _dynamic_name(self, key: ast.expr, node: ast.AST, reach: str) -> None:
        """`reach` (getattr, vars(...)[...], import_module) gets a name that is built from pieces."""
        if isinstance(key, ast.Constant):
            return  # a literal: the text rules and the other rules read it as it is
        value = fold(key, self.names, self.dotted)
        if value is not None:
            why = guarded_name(value)
            if why:
                self.add("dynamic-name", ERROR, node, f"`{reach}` reaches `{value}`, a name built at run time "
                         f"from pieces ({why})", "a name hidden from the server's word ban and from review is a "
                         "hack; write names out, and leave alone what the rules guard")
            return
        if is_built(key):
            self.add("dynamic-name", WARNING, node, f"`{reach}` reaches a name built at run time from pieces",
                     "reviewers and the server's word ban can't tell what it reaches; write the name out")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = node.value
        if (isinstance(base, ast.Attribute) and base.attr == "__dict__") or (
                isinstance(base, ast.Call) and self.dotted(base.func) in _NAMESPACES):
            self._dynamic_name(node.slice, node, f"{ast.unparse(base)}[...]")
        elif self.dotted(base) == "sys.modules":
            self._dynamic_name(node.slice, node, "sys.modules[...]")
        self.generic_visit(node)

    # ------------------------------------------------------------------------ structure

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name == ENTRY:
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if self.dotted(target) in _CACHE_DECORATORS:
                    self.add("output-cache", ERROR, deco, f"`{ENTRY}` is memoized with"
                             f" `{self.dotted(target)}`: repeated calls return a stored output",
                             "the timed calls must compute their output; cache compiled kernels, not results")
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        hooks = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if any(self.dotted(b) == "torch.Tensor" for b in node.bases) or hooks & _TENSOR_HOOKS:
            self.add("lazy-output", WARNING, node, f"class `{node.name}` is a tensor subclass or hooks torch"
                     " dispatch: its values may be computed only when read, after the timer stops",
                     "return a plain torch.Tensor holding the result")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if _is_main_guard(node) and not self.functions:
            saved, self.in_main_guard = self.in_main_guard, True
            self.generic_visit(node)
            self.in_main_guard = saved
        else:
            self.generic_visit(node)

    # -------------------------------------------------------------------------- imports

    def _import(self, node: ast.AST, module: str, names: list[str]) -> None:
        root = module.split(".")[0]
        if root in _HARNESS_MODULES:
            self.add("harness-import", ERROR, node, f"imports `{module}`, the evaluator",
                     "a submission must not reach into the harness that times and checks it")
        elif root == "reference":
            bad = sorted(set(names) & {"check_implementation"})
            if bad:
                self.add("harness-import", ERROR, node, "imports `check_implementation` from the reference",
                         "a submission has no use for the checker; it can only be patched or mimicked")
            else:
                self.add("reference-import", WARNING, node, "imports the task's reference module",
                         "fine for a fallback to ref_kernel; reading generate_input to predict inputs is a hack")
        if root in ("pip", "ensurepip"):
            self.add("runtime-install", ERROR, node, f"imports `{root}`: installs packages at run time",
                     "the leaderboard flags runtime installs; use what the runner image has")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._import(node, alias.name, [])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._import(node, node.module or "", [a.name for a in node.names])

    # ------------------------------------------------------------------------ stores

    def _store(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._store(elt, node)
            return
        if isinstance(target, ast.Attribute):
            base = self.dotted(target.value) or ""
            self._patched(base, target.attr, node)
        elif isinstance(target, ast.Subscript):
            base = self.dotted(target.value) or ""
            if base == "sys.modules":
                self.add("sys-modules", ERROR, node, "writes into `sys.modules`",
                         "replacing modules lets a submission swap the harness's torch or time functions")
            elif base in ("builtins", "__builtins__") or base.endswith(".__dict__"):
                self.add("harness-patch", ERROR, node, f"writes into `{base}`",
                         "patching builtins or module dictionaries changes what the harness runs")

    def _patched(self, base: str, attr: str, node: ast.AST) -> None:
        full = f"{base}.{attr}" if base else attr
        root = base.split(".")[0]
        timer = (attr in _TIMER_ALWAYS or (attr in ("time", "time_ns") and base == "time")
                 or (attr in ("Event", "record") and ("cuda" in base or base.endswith("Event")))
                 or (attr == "Timer" and base in ("timeit", "torch.utils.benchmark")))
        if timer:
            self.add("timer-patch", ERROR, node, f"replaces `{full}`, which the harness times with",
                     "timers and synchronize must stay as torch and time define them")
        elif root in _HARNESS_MODULES | {"reference", "utils"} or attr in _HARNESS_NAMES:
            self.add("harness-patch", ERROR, node, f"replaces `{full}`, part of the evaluator",
                     "the checker and reference must run as the task defines them")
        elif base == "sys" and attr == "modules":
            self.add("sys-modules", ERROR, node, "replaces `sys.modules`", "leave the module table alone")
        elif root in ("builtins", "__builtins__"):
            self.add("harness-patch", ERROR, node, f"replaces `{full}`",
                     "patching builtins changes what the harness runs")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._store(target, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._store(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._store(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._store(target, node)
        self.generic_visit(node)

    # ------------------------------------------------------------------------- reads

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "check_implementation":
            self._checker_use(node)
        elif node.attr in _FRAME_ATTRS:
            self.add("frame-walk", ERROR, node, f"reads `.{node.attr}`: walks interpreter frames",
                     "frames reach the harness's variables (expected outputs, timers)")
        elif isinstance(node.ctx, ast.Load) and self.dotted(node) == "sys.argv":
            # Inside custom_kernel it can only serve to branch on the mode (KernelGuard calls that hacked).
            where = f", inside `{ENTRY}`" if self.in_entry() else ""
            self.add("mode-branch", ERROR if where else WARNING, node,
                     f"reads `sys.argv`, which holds the eval's mode{where}",
                     "behaving differently in test and benchmark mode is a hack; the same code must run in every mode")
        elif isinstance(node.ctx, ast.Load) and self.dotted(node) == "sys.modules":
            self.add("sys-modules", WARNING, node, "reads `sys.modules`",
                     "looking up loaded modules is how harness tampering starts; import what you need")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "POPCORN_FD" in node.value and id(node) not in self.docstrings:
            self.add("result-fd", ERROR, node, "names POPCORN_FD, the harness's result pipe",
                     "a submission must never read or write the result pipe")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "check_implementation":
            self._checker_use(node)

    def _checker_use(self, node: ast.AST) -> None:
        self.add("harness-patch", ERROR, node, "uses `check_implementation`, the task's checker",
                 "a submission has no use for the checker; it can only be patched or mimicked")

    # ------------------------------------------------------------------------- calls

    def visit_Call(self, node: ast.Call) -> None:
        name = self.dotted(node.func) or ""
        args = node.args
        literal = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name == "setattr" and len(args) >= 2 and isinstance(args[1], ast.Constant):
            self._patched(self.dotted(args[0]) or "", str(args[1].value), node)
        elif name.endswith("patch.object") and len(args) >= 2 and isinstance(args[1], ast.Constant):
            self._patched(self.dotted(args[0]) or "", str(args[1].value), node)
        elif (name.endswith("mock.patch") or name == "patch" or name.endswith(".setattr")) and literal:
            base, _, attr = literal[0].rpartition(".")
            if base:
                self._patched(base, attr, node)
        if name in _FD_CALLS or (name in ("open", "io.open") and args and isinstance(args[0], ast.Constant)
                                 and isinstance(args[0].value, int)):
            self.add("result-fd", ERROR, node, f"`{name}` writes to a raw file descriptor",
                     "the harness reads results from a pipe fd; print to stdout for debugging instead")
        if name in _FRAME_CALLS:
            self.add("frame-walk", ERROR, node, f"calls `{name}`: inspects frames or live objects",
                     "frames and gc walks reach the harness's variables (expected outputs, timers)")
        if name.startswith("sys.modules.") and name.rsplit(".", 1)[1] in _MODULES_MUTATORS:
            self.add("sys-modules", ERROR, node, f"calls `{name}`", "leave the module table alone")
        if name in _SHELL_CALLS or name == "pip.main" or name.startswith("pip."):
            words = " ".join(_strings(node)).lower()
            if name.startswith("pip.") or _INSTALL.search(words):
                self.add("runtime-install", ERROR, node, f"installs packages at run time (`{name}`)",
                         "the leaderboard flags runtime installs; use what the runner image has")
        if name in _NAME_ARG and len(args) > _NAME_ARG[name]:
            self._dynamic_name(args[_NAME_ARG[name]], node, name)
        elif name.endswith("__getattribute__") and args:
            self._dynamic_name(args[-1], node, name)
        if name in ("importlib.import_module", "__import__") and args:
            module = fold(args[0], self.names, self.dotted)
            if module is not None:
                self._import(node, module, [])
        if name in ("exec", "eval", "compile") and name not in self.aliases and args and not (
                isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            self.add("exec-built", WARNING, node, f"`{name}` of a string built at run time",
                     "reviewers can't read generated code; write it out in the file")
        elif name in ("marshal.loads", "types.CodeType"):
            self.add("exec-built", WARNING, node, f"`{name}` builds code objects at run time",
                     "reviewers can't read generated code; write it out in the file")
        if name in _CONCURRENCY and not self.in_main_guard:
            if self.in_entry():
                self.add("thread-start", ERROR, node, f"`{name}` inside `{ENTRY}`: work can continue after"
                         " the timer stops", "do all the work on the calling thread before returning")
            elif not self.functions:
                self.add("thread-start", WARNING, node, f"`{name}` at import: background work can overlap"
                         " the timed calls", "start no threads or processes at import")
        self.generic_visit(node)


# ------------------------------------------------------------------------- data_ptr / id caches


def _identity_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "data_ptr")
        or (isinstance(node.func, ast.Name) and node.func.id == "id"))


def _keyed(expr: ast.AST, tainted: set[str]) -> bool:
    return any(_identity_call(n) or (isinstance(n, ast.Name) and n.id in tainted) for n in ast.walk(expr))


def _lookup_key(node: ast.AST) -> ast.AST | None:
    """The key of a mapping access: d[key], d.get(key), key in d."""
    if isinstance(node, ast.Subscript):
        return node.slice
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in _LOOKUP_METHODS and node.args):
        return node.args[0]
    if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        return node.left
    return None


def _cache_findings(scope: ast.AST, body: list[ast.AST], name: str) -> list[Diagnostic]:
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    tainted: set[str] = set()
    for _ in range(2):  # two passes let `k = x.data_ptr(); key = (k, n)` taint both names
        for n in nodes:
            if isinstance(n, ast.Assign) and _keyed(n.value, tainted):
                tainted |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    lookups = [n for n in nodes if (key := _lookup_key(n)) is not None and _keyed(key, tainted)]
    if not lookups:
        return []
    looked = {id(n) for n in lookups}
    cached = {t.id for n in nodes if isinstance(n, ast.Assign) and id(n.value) in looked
              for t in n.targets if isinstance(t, ast.Name)}
    for n in nodes:
        if isinstance(n, ast.Return) and n.value is not None and (
                id(n.value) in looked or (isinstance(n.value, ast.Name) and n.value.id in cached)):
            return [finding("output-cache", ERROR, n.lineno, n.col_offset + 1,
                            f"`{name}` returns a value cached by `data_ptr()`/`id()` of its input",
                            "the leaderboard reallocates and rechecks inputs; a replayed output is a hack")]
    first = lookups[0]
    return [finding("output-cache", WARNING, first.lineno, first.col_offset + 1,
                    f"a cache in `{name}` is keyed on `data_ptr()`/`id()`",
                    "freed memory is reused at the same address; key caches on shape and dtype instead")]


def _replay_findings(tree: ast.Module) -> list[Diagnostic]:
    """custom_kernel returning something stored in a module-level container: a replayed output."""
    containers = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            value = stmt.value
            is_container = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
                isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute))
                and ast.unparse(value.func) in _CONTAINERS)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if is_container:
                containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    entry = next((s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name == ENTRY), None)
    if entry is None or not containers:
        return []

    def stored(expr: ast.AST, names: set[str]) -> bool:
        if isinstance(expr, ast.Subscript):
            return isinstance(expr.value, ast.Name) and expr.value.id in containers
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get":
            return isinstance(expr.func.value, ast.Name) and expr.func.value.id in containers
        return isinstance(expr, ast.Name) and expr.id in names

    names: set[str] = set()
    nodes = list(ast.walk(entry))
    for n in nodes:
        if isinstance(n, ast.Assign) and stored(n.value, names):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in nodes:
        if isinstance(n, ast.Return) and n.value is not None and stored(n.value, names):
            return [finding("output-replay", WARNING, n.lineno, n.col_offset + 1,
                            f"`{ENTRY}` returns a value kept in a module-level container across calls",
                            "every call must compute its output from its own input; a stored result is a replay")]
    return []


def _aliases(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _binds_entry(tree: ast.Module) -> bool:
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == ENTRY:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == ENTRY for t in targets for n in ast.walk(t)):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) in (ENTRY, "*") for a in node.names):
                return True
        for attr in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                pending.extend(getattr(node, attr, []))
        for handler in getattr(node, "handlers", []):
            pending.extend(handler.body)
    return False


def hack_findings(text: str, filename: str) -> list[Diagnostic]:
    """Every reward-hack rule on one Python source; a syntax error is itself an error finding."""
    try:
        tree = ast.parse(text.removeprefix("\ufeff"), filename=filename)  # Python skips a leading BOM too
    except SyntaxError as exc:
        return [finding("syntax", ERROR, exc.lineno, exc.offset, f"syntax error: {exc.msg}",
                        "the remote run would fail at import; `python -m py_compile FILE` shows the same")]
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    visitor = _HackVisitor(_aliases(tree), docstrings, constant_names(tree))
    visitor.visit(tree)
    found = visitor.found
    module_body = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                              ast.ClassDef))]
    found += _cache_findings(tree, module_body, "module code")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += _cache_findings(node, node.body, node.name)
    cached_lines = {f.line for f in found if f.rule == "output-cache"}
    found += [f for f in _replay_findings(tree) if f.line not in cached_lines]
    if not _binds_entry(tree):
        found.append(finding("no-custom-kernel", ERROR, None, None, f"no `{ENTRY}` defined at module level",
                             f"define `def {ENTRY}(data):` returning the output"))
    # One finding per rule and line: a patch seen as a store and as a name would otherwise repeat,
    # and a nested function's cache is seen from its own scope and its parent's.
    unique: dict[tuple, Diagnostic] = {}
    for f in sorted(found, key=lambda f: f.severity != ERROR):
        unique.setdefault((f.rule, f.line), f)
    return list(unique.values())
