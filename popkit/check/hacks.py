"""Static reward-hack rules for Python submissions, read from the syntax tree.

Each rule names the class of cheat it catches (popkit.check.rules lists them all): timer or synchronize
patching, harness or evaluator tampering, writes to file descriptors, `sys.modules` surgery, frame
walking, runtime package installs, names built from pieces (popkit.check.reach, lint_names), code run
from strings (a string that folds is checked as code too), threads or processes started at import or
inside `custom_kernel`; code objects, pickles, modules loaded by path and planted module files are
popkit.check.calls, output caches popkit.check.caches. The tree is used rather than text so that comments,
docstrings and kernel source strings don't trigger rules.
"""

from __future__ import annotations

import ast
import re
import sys
import threading
from typing import Any, Callable

from popkit.check import calls as lint_calls
from popkit.check.caches import output_findings
from popkit.check.fold import choices, fold, fold_value
from popkit.check.names import Bindings, aliases, bindings, is_built
from popkit.check.reach import MODULE_REACH, Reach
from popkit.check.rules import finding
from popkit.model.diagnostics import ERROR, WARNING, Diagnostic
from popkit.resources import HARNESS_MODULES

ENTRY = "custom_kernel"

# Attributes no kernel has a reason to assign, whatever object they hang on.
_TIMER_ALWAYS = {"elapsed_time", "synchronize", "perf_counter", "perf_counter_ns", "monotonic",
                 "monotonic_ns", "process_time", "process_time_ns"}
_HARNESS_MODULES = {"eval", "popkit_eval", *(name[:-3] for name in HARNESS_MODULES)}  # the harness's modules
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
DEEP_STACK_BYTES = 256 * 2**20  # the checking thread's stack: room for DEEP_RECURSION frames
DEEP_RECURSION = 100_000  # Python frames the checking thread may use (the parser stops near 3,000 levels)
MAX_CODE_DEPTH = 3  # code in a string in a string...: how deep strings run by exec are checked
_INSTALL = re.compile(r"\b(pip3?|conda|mamba|uv)\b.*\binstall\b")
_TENSOR_HOOKS = {"__torch_function__", "__torch_dispatch__"}
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
    parts = name.replace(":", ".").split(".")
    return _GUARDED.get(parts[-1]) or (_GUARDED.get(parts[0]) if parts[0] in _HARNESS_MODULES else None)


def _is_main_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


class _HackVisitor(ast.NodeVisitor):
    def __init__(self, aliases: dict[str, str], docstrings: set[int], names: Bindings, depth: int = 0):
        self.aliases = aliases  # local name -> what it was imported or assigned as (dotted)
        self.docstrings = docstrings  # id() of docstring constants: prose, not code
        self.names = names  # every binding of every name, for folding built strings
        self.reach = Reach(names.tree, names, self.callee)
        self.depth = depth  # 0 for the file, 1 and up for code in strings it runs
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

    def callee(self, node: ast.AST) -> str | None:
        """A called function's dotted name; `builtins.getattr` is `getattr`."""
        name = self.dotted(node)
        for prefix in ("builtins.", "__builtins__."):
            if name and name.startswith(prefix):
                return name[len(prefix):]
        return name

    def fold(self, node: ast.expr, env: dict | None = None) -> str | None:
        return fold(node, self.names, self.callee, env)

    def fold_value(self, node: ast.expr) -> object:
        return fold_value(node, self.names, self.callee)

    def is_built(self, node: ast.expr) -> bool:
        return is_built(node, self.names)

    def in_entry(self) -> bool:
        return ENTRY in self.functions

    def _dynamic_name(self, key: ast.expr, node: ast.AST, reach: str, env: dict | None = None, via: str = "") -> None:
        """`reach` (getattr, vars(...)[...], import_module, a function handing its parameter to one) gets a
        name that is not written out: an error when any value it may have is guarded, a warning when it is
        built and cannot be folded."""
        if isinstance(key, ast.Constant) and env is None:
            return  # a literal: the text rules and the other rules read it as it is
        values, unknown = choices(key, self.names, self.callee, env)
        reach = f"`{reach}` in `{via}`" if via else f"`{reach}`"
        for value in values:
            why = guarded_name(value)
            if why:
                self.add("dynamic-name", ERROR, node, f"{reach} reaches `{value}`, a name built at run time "
                         f"from pieces ({why})", "a name hidden from the server's word ban and from review is a "
                         "hack; write names out, and leave alone what the rules guard")
                return
        if unknown and is_built(key, self.names, env):
            self.add("dynamic-name", WARNING, node, f"{reach} reaches a name built at run time from pieces"
                     " that popkit cannot fold", "reviewers and the server's word ban can't tell what it reaches;"
                     " write the name out")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        base = node.value
        if self.reach.namespace(base):
            label = "sys.modules[...]" if self.dotted(base) == "sys.modules" else f"{ast.unparse(base)}[...]"
            self._dynamic_name(node.slice, node, label)
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

    def import_(self, node: ast.AST, module: str, names: list[str]) -> None:
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
            self.import_(node, alias.name, [])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.import_(node, node.module or "", [a.name for a in node.names])

    # ------------------------------------------------------------------------ stores

    def _store(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._store(elt, node)
            return
        if isinstance(target, ast.Attribute):
            base = self.dotted(target.value) or ""
            self._patched(base, target.attr, node)
            lint_calls.code_store(self, target.attr, node)
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
            self.add("sys-modules", ERROR, node, "reads `sys.modules`",
                     "the module table reaches the harness's own module in the worker; import what you need "
                     "(or say why: `# popkit: allow sys-modules -- reason`)")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "__mp_main__":
            self.add("sys-modules", ERROR, node, "names `__mp_main__`, the harness's module in the worker",
                     "a kernel has no use for the harness's module; it can only tamper with it")
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
        name = self.callee(node.func) or ""
        args = node.args
        literal = [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name == "setattr" and len(args) >= 2:
            attr = self.fold(args[1])
            if attr is not None:
                self._patched(self.dotted(args[0]) or "", attr, node)
                lint_calls.code_store(self, attr, node)
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
        self._names_reached(node, name)
        self._code_string(node, name)
        lint_calls.code_object(self, node, name)
        lint_calls.unpickle(self, node, name)
        lint_calls.load_by_path(self, node, name)
        lint_calls.module_write(self, node, name)
        if name in _CONCURRENCY and not self.in_main_guard:
            if self.in_entry():
                self.add("thread-start", ERROR, node, f"`{name}` inside `{ENTRY}`: work can continue after"
                         " the timer stops", "do all the work on the calling thread before returning")
            elif not self.functions:
                self.add("thread-start", WARNING, node, f"`{name}` at import: background work can overlap"
                         " the timed calls", "start no threads or processes at import")
        self.generic_visit(node)

    def _names_reached(self, node: ast.Call, name: str) -> None:
        """dynamic-name on every reach of this call: its own name argument, and the names a call of the
        file's own function hands on to a reach inside it (bound to this call's arguments)."""
        key = self.reach.key(node)
        if key is not None:
            self._dynamic_name(key[0], node, key[1])
        for expr, env, label, via in self.reach.inlined(node):
            self._dynamic_name(expr, node, label, env, via)
        if name in MODULE_REACH and node.args:
            modules, _unknown = choices(node.args[0], self.names, self.callee)
            for module in modules:
                self.import_(node, module.split(":")[0], [])

    def _code_string(self, node: ast.Call, name: str) -> None:
        """exec/eval/compile: code in a string is checked as code where it folds; built code is a warning."""
        if name not in ("exec", "eval", "compile") or name in self.aliases or not node.args:
            return
        arg = node.args[0]
        written = isinstance(arg, ast.Constant) and isinstance(arg.value, (str, bytes))
        if not written:
            self.add("exec-built", WARNING, node, f"`{name}` of a string built at run time",
                     "reviewers can't read generated code; write it out in the file")
        text = self.fold(arg)
        if text is None or self.depth >= MAX_CODE_DEPTH:
            return
        for inner in _code_findings(text, self.aliases, self.depth + 1):
            self.add(inner.rule, inner.severity, node, f"in the code `{name}` runs: {inner.message}", inner.hint)



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


def _docstrings(nodes: list[ast.AST]) -> set[int]:
    return {id(n.body[0].value) for n in nodes
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _visit(tree: ast.Module, outer: dict[str, str] | None = None, depth: int = 0) -> list[Diagnostic]:
    names = bindings(tree)
    visitor = _HackVisitor({**(outer or {}), **aliases(names)}, _docstrings(names.nodes), names, depth)
    visitor.visit(tree)
    return visitor.found


def _code_findings(text: str, outer: dict[str, str], depth: int) -> list[Diagnostic]:
    """The hack rules on code a string holds (exec, eval, compile), with the file's imports in scope."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # not code: exec would fail too, and the exec-built warning stands
    return _visit(tree, outer, depth)


def _with_room(work: Callable[[], list[Diagnostic]]) -> list[Diagnostic]:
    """Run `work` where the deepest tree Python's parser builds (a few thousand levels) fits: a thread with
    a large stack and a raised recursion limit, restored after. A crafted file must not crash the check."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["found"] = work()
        except BaseException as exc:  # noqa: B036  (handed to the calling thread)
            result["error"] = exc

    limit, size = sys.getrecursionlimit(), threading.stack_size()
    try:
        threading.stack_size(DEEP_STACK_BYTES)
    except (ValueError, RuntimeError):  # a platform that cannot give a thread that stack: the default room
        return work()
    sys.setrecursionlimit(max(limit, DEEP_RECURSION))
    try:
        thread = threading.Thread(target=target, name="popkit-check")
        thread.start()
        thread.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    if "error" in result:
        raise result["error"]
    return result["found"]


def hack_findings(text: str, filename: str) -> list[Diagnostic]:
    """Every reward-hack rule on one Python source; a syntax error is itself an error finding."""
    try:
        tree = ast.parse(text.removeprefix("\ufeff"), filename=filename)  # Python skips a leading BOM too
    except SyntaxError as exc:
        return [finding("syntax", ERROR, exc.lineno, exc.offset, f"syntax error: {exc.msg}",
                        "the remote run would fail at import; `python -m py_compile FILE` shows the same")]
    except (RecursionError, MemoryError):
        return [finding("syntax", ERROR, None, None, "Python cannot build this file's syntax tree: an expression"
                        " is nested too deeply", "the remote run would fail at import too; split the expression")]
    try:
        found = _with_room(lambda: _visit(tree) + output_findings(tree))
    except RecursionError:
        return [finding("syntax", ERROR, None, None, "an expression is nested too deeply for popkit to check",
                        "split the expression; Python's compiler refuses such nesting not much deeper")]
    if not _binds_entry(tree):
        found.append(finding("no-custom-kernel", ERROR, None, None, f"no `{ENTRY}` defined at module level",
                             f"define `def {ENTRY}(data):` returning the output"))
    # One finding per rule and line: a patch seen as a store and as a name would otherwise repeat,
    # and a nested function's cache is seen from its own scope and its parent's.
    unique: dict[tuple, Diagnostic] = {}
    for f in sorted(found, key=lambda f: f.severity != ERROR):
        unique.setdefault((f.rule, f.line), f)
    return list(unique.values())
