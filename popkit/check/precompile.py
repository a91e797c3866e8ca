"""The leaderboard's compile path for a file, predicted from its source (`popkit check`, `popkit compile`).

The runner's rules (kernelbot, 2026-09): a CPU worker, without a GPU, precompiles a `py` submission whose source
contains `load_inline`: it runs `python3 submission.py` (POPCORN_SEED=1, MAX_JOBS=2, TORCH_CUDA_ARCH_LIST from the
task's SM, 120 s) and caches each extension under the sha256 of the bound load_inline arguments (build_directory and
verbose left out) with torch's version, its CUDA version, the Python SOABI, the machine, the CXX11 ABI and the arch
list. An artifact over 64 MiB unpacked or 1 MiB zipped falls back to compiling on the GPU; the GPU replay compiles
nothing itself and checks each `.so` by SHA-256. Statuses: compiled, skipped, fallback, reused, partial.

Read statically (the syntax tree; strings folded as popkit check folds them), per load_inline call: whether it runs
at import, its arguments bound and digested, whether an argument depends on the GPU (the CPU worker's value differs
from the GPU's, so the cached key is not the one the ranked run asks for), and whether the import does device work
before the call (it fails on the CPU worker). With a build folder (`popkit compile` made one), each extension's
`.so` is measured, unpacked and zipped, against the size limits.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from popkit.check.fold import fold_value
from popkit.check.names import Bindings, aliases, bindings
from popkit.resources import popkit_home

BUILD_RECORD = "popkit-build.json"  # what popkit compile writes in each build folder (compile.RECORD)
MAX_UNPACKED_BYTES = 64 * 1024 * 1024
MAX_ZIPPED_BYTES = 1024 * 1024
PRECOMPILE_TIMEOUT_S = 120.0
# load_inline's parameters in order (torch 2.11), for binding positional arguments
PARAMETERS = ("name", "cpp_sources", "cuda_sources", "sycl_sources", "functions", "extra_cflags",
              "extra_cuda_cflags", "extra_sycl_cflags", "extra_ldflags", "extra_include_paths", "build_directory",
              "verbose", "with_cuda", "is_python_module", "with_pytorch_error_handling", "keep_intermediates",
              "use_pch", "no_implicit_headers")
NOT_KEYED = ("build_directory", "verbose")
ENVIRONMENT_KEYS = ("torch", "torch_cuda", "soabi", "machine", "cxx11_abi", "arch_list")
_HARMLESS_CUDA = {"torch.cuda.is_available", "torch.cuda.device_count"}  # answer on a machine without a GPU


@dataclass(frozen=True)
class Artifact:
    """An extension's `.so` as popkit compile built it, against the runner's limits."""

    path: str
    unpacked_bytes: int
    zipped_bytes: int

    @property
    def too_large(self) -> bool:
        return self.unpacked_bytes > MAX_UNPACKED_BYTES or self.zipped_bytes > MAX_ZIPPED_BYTES


@dataclass(frozen=True)
class Extension:
    """One load_inline call: where it is, when it runs, what its cache key is made of, what stops its precompile."""

    line: int
    name: str | None  # the `name` argument, when it folds
    at_import: bool  # the call runs when the file is imported (module level, or a function called there)
    argument_digest: str | None  # sha256 of the bound arguments (build_directory, verbose left out); None: not static
    unknown: tuple[str, ...]  # arguments that do not fold to constants
    gpu_dependent: tuple[str, ...]  # arguments whose value comes from the GPU (torch.cuda...)
    device_work_before: int | None  # line of device work at import before this call (fails without a GPU)
    artifact: Artifact | None = None
    status: str = ""  # compiled or fallback
    why: str = ""


@dataclass(frozen=True)
class PrecompilePrediction:
    status: str  # compiled, skipped, fallback, partial (the runner's names; `reused` needs the server's cache)
    reason: str
    extensions: tuple[Extension, ...] = ()
    device_work_lines: tuple[int, ...] = ()  # module-level device work (a GPU is needed at import)
    key: str | None = None  # with `environment`: the digests of every extension and the environment, together
    environment: Mapping[str, str] = field(default_factory=dict)
    pays: str = ""  # what the ranked run pays for this path

    def to_json(self) -> dict:
        return {"status": self.status, "reason": self.reason, "pays": self.pays, "key": self.key,
                "environment": dict(self.environment), "device_work_lines": list(self.device_work_lines),
                "limits": {"unpacked_bytes": MAX_UNPACKED_BYTES, "zipped_bytes": MAX_ZIPPED_BYTES,
                           "timeout_s": PRECOMPILE_TIMEOUT_S},
                "extensions": [{**asdict(e), "unknown": list(e.unknown), "gpu_dependent": list(e.gpu_dependent),
                                "artifact": asdict(e.artifact) if e.artifact else None} for e in self.extensions]}


class _Reader:
    """The file's tree with its names resolved: dotted names of calls, module-level bindings."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.names: Bindings = bindings(tree)
        self.alias = aliases(self.names)

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.alias.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def is_load_inline(self, call: ast.Call) -> bool:
        name = self.dotted(call.func) or ""
        return name == "load_inline" or name.endswith(".load_inline")

    def device_work(self, node: ast.AST) -> bool:
        """A call that needs a GPU: x.cuda(), torch.cuda.* (but is_available/device_count), device='cuda'."""
        for sub in self._unguarded(node):
            if not isinstance(sub, ast.Call):
                continue
            name = self.dotted(sub.func) or ""
            if isinstance(sub.func, ast.Attribute) and sub.func.attr == "cuda" and not name.startswith("torch."):
                return True
            if name.startswith("torch.cuda.") and name not in _HARMLESS_CUDA:
                return True
            targets = [k.value for k in sub.keywords if k.arg == "device"]
            if isinstance(sub.func, ast.Attribute) and sub.func.attr == "to" and sub.args:
                targets.append(sub.args[0])
            if any(self._cuda_value(t) for t in targets):
                return True
        return False

    def guarded(self, test: ast.AST) -> bool:
        """A test that is false without a GPU (`torch.cuda.is_available()`, `device_count() > 0`)."""
        return any((self.dotted(n) or "") in _HARMLESS_CUDA for n in ast.walk(test))

    def _unguarded(self, node: ast.AST):
        """ast.walk, but not into what only runs where a GPU is (`x if torch.cuda.is_available() else y`)."""
        todo = [node]
        while todo:
            sub = todo.pop()
            yield sub
            if isinstance(sub, ast.IfExp) and self.guarded(sub.test):
                todo += [sub.test, sub.orelse]
            else:
                todo += list(ast.iter_child_nodes(sub))

    def _cuda_value(self, node: ast.AST, depth: int = 0) -> bool:
        if isinstance(node, ast.Call) and (self.dotted(node.func) or "") == "torch.device" and node.args:
            node = node.args[0]
        if isinstance(node, ast.Name) and depth < 8:
            bound = self.names.of(node.id)
            if len(bound) == 1 and bound[0].expr is not None:
                return self._cuda_value(bound[0].expr, depth + 1)
        value = fold_value(node, self.names, self.dotted)
        return isinstance(value, str) and value.startswith("cuda")

    def gpu_dependent(self, node: ast.AST, depth: int = 0) -> bool:
        """The expression reads the GPU (torch.cuda...), itself or through the names it uses (bounded)."""
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Attribute, ast.Name)) and (self.dotted(sub) or "").startswith("torch.cuda"):
                return True
            if isinstance(sub, ast.Name) and depth < 8:
                for binding in self.names.of(sub.id):
                    if binding.expr is not None and self.gpu_dependent(binding.expr, depth + 1):
                        return True
        return False


def _import_time_statements(tree: ast.Module, guarded) -> list[ast.stmt]:
    """Statements run at import on a machine without a GPU, in order: the module body, into if/with/try/for
    blocks (not the body of an `if` that `guarded` says is false there) and class bodies, and the bodies of
    functions the module level calls by name (once each)."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out: list[ast.stmt] = []
    entered: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                if isinstance(call.func, ast.Name) and call.func.id in functions and call.func.id not in entered:
                    entered.add(call.func.id)
                    visit(functions[call.func.id].body)
            out.append(stmt)
            for block in ("body", "orelse", "finalbody"):
                if not (block == "body" and isinstance(stmt, ast.If) and guarded(stmt.test)):
                    visit(getattr(stmt, block, None) or [])
            for handler in getattr(stmt, "handlers", None) or []:
                visit(handler.body)

    visit(tree.body)
    return out


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """A statement's expressions, without the statements nested in it (visited on their own)."""
    nested = {id(s) for block in ("body", "orelse", "finalbody", "handlers")
              for s in (getattr(stmt, block, None) or []) if isinstance(s, (ast.stmt, ast.excepthandler))}
    return [child for child in ast.iter_child_nodes(stmt) if id(child) not in nested]


def _bound(call: ast.Call, reader: _Reader) -> tuple[dict[str, Any], list[str], list[str]]:
    """(folded arguments by parameter name, arguments that do not fold, arguments that read the GPU)."""
    given = dict(zip(PARAMETERS, call.args))
    given.update({k.arg: k.value for k in call.keywords if k.arg})
    values, unknown, gpu = {}, [], []
    for name, node in given.items():
        if name in NOT_KEYED:
            continue
        if reader.gpu_dependent(node):
            gpu.append(name)
        value = _literal(node, reader.names)
        value = fold_value(node, reader.names, reader.dotted) if value is None else value
        if value is None and not (isinstance(node, ast.Constant) and node.value is None):
            unknown.append(name)
        values[name] = value
    return values, unknown, gpu


def _literal(node: ast.AST, names: Bindings, depth: int = 0) -> Any:
    """Constants, names bound once to them, `+` and lists of them, however long (lint_fold stops at 10,000
    characters; a kernel's source is often longer); None for anything else."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        bound = names.of(node.id)
        single = len(bound) == 1 and bound[0].kind == "value" and node.id not in names.changed
        return _literal(bound[0].expr, names, depth + 1) if single and bound[0].expr is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, names, depth + 1), _literal(node.right, names, depth + 1)
        return left + right if isinstance(left, str) and isinstance(right, str) else None
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_literal(item, names, depth + 1) for item in node.elts]
        return None if any(item is None for item in items) else items
    return None


def _digest(values: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=list).encode()).hexdigest()


def measure(so: Path) -> Artifact:
    """An extension's shared object, its size and its size zipped (deflate, as an artifact upload packs it)."""
    data = so.read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(so.name, data)
    return Artifact(str(so), len(data), len(buffer.getvalue()))


def find_artifact(build_dir: Path, name: str | None) -> Artifact | None:
    """The `.so` torch built for extension `name` under a build folder (TORCH_EXTENSIONS_DIR)."""
    if not name or not build_dir.is_dir():
        return None
    found = sorted((build_dir / name).glob("*.so")) if (build_dir / name).is_dir() else []
    return measure(found[0]) if found else None


def predict(text: str, *, build_dir: Path | None = None, environment: Mapping[str, str] | None = None,
            cold_s: float | None = None) -> PrecompilePrediction:
    """The runner's compile path for a file's source (see the module doc). `environment`: the key's facts besides
    the arguments (ENVIRONMENT_KEYS), for the whole key; `cold_s`: a measured cold build, for what it costs."""
    env = dict(environment or {})
    if "load_inline" not in text:
        return PrecompilePrediction("skipped", "the source does not contain `load_inline`: the CPU worker does not "
                                    "precompile it", pays="nothing: no extension is built", environment=env)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return PrecompilePrediction("fallback", "the file does not parse: its precompile fails",
                                    pays=_pays("fallback", cold_s), environment=env)
    reader = _Reader(tree)
    at_import: list[tuple[ast.stmt, bool]] = []
    device_lines: list[int] = []
    for stmt in _import_time_statements(tree, reader.guarded):
        work = any(reader.device_work(node) for node in _own_nodes(stmt))
        if work:
            device_lines.append(stmt.lineno)
        at_import.append((stmt, work))
    import_calls = {id(n) for stmt, _ in at_import for own in _own_nodes(stmt) for n in ast.walk(own)
                    if isinstance(n, ast.Call)}
    extensions = []
    for call in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and reader.is_load_inline(n)),
                       key=lambda n: (n.lineno, n.col_offset)):
        values, unknown, gpu = _bound(call, reader)
        before = next((line for line in device_lines if line < call.lineno), None)
        name = values.get("name") if isinstance(values.get("name"), str) else None
        artifact = find_artifact(build_dir, name) if build_dir else None
        ext = Extension(line=call.lineno, name=name, at_import=id(call) in import_calls,
                        argument_digest=None if unknown else _digest(values), unknown=tuple(unknown),
                        gpu_dependent=tuple(gpu), device_work_before=before, artifact=artifact)
        extensions.append(_judged(ext))
    return _prediction(tuple(extensions), tuple(device_lines), env, cold_s)


def _judged(ext: Extension) -> Extension:
    if not ext.at_import:
        why = "load_inline is not called at import: it builds at the first call, on the GPU"
    elif ext.device_work_before is not None:
        why = (f"line {ext.device_work_before} does device work at import before it: the CPU worker has no GPU, "
               "so the precompile stops there")
    elif ext.gpu_dependent:
        why = (f"its {', '.join(ext.gpu_dependent)} depend(s) on the GPU: the CPU worker's key differs from the one "
               "the GPU run asks for")
    elif ext.artifact and ext.artifact.too_large:
        size, zipped = ext.artifact.unpacked_bytes / 2**20, ext.artifact.zipped_bytes / 2**20
        why = (f"its artifact is {size:.1f} MiB ({zipped:.2f} "
               "MiB zipped), over the runner's 64 MiB / 1 MiB limits")
    else:
        return replace(ext, status="compiled", why="built on the CPU worker, replayed on the GPU by its hash")
    return replace(ext, status="fallback", why=why)


def _prediction(extensions: tuple[Extension, ...], device_lines: tuple[int, ...], env: dict,
                cold_s: float | None) -> PrecompilePrediction:
    if not extensions:
        return PrecompilePrediction("skipped", "`load_inline` is in the text but no call of it was found: the "
                                    "precompile runs the file and builds nothing", device_work_lines=device_lines,
                                    pays="nothing: no extension is built", environment=env)
    statuses = {e.status for e in extensions}
    status = statuses.pop() if len(statuses) == 1 else "partial"
    first = next((e for e in extensions if e.status == "fallback"), extensions[0])
    reason = (f"line {first.line}: {first.why}" if status != "compiled" else
              f"{len(extensions)} extension(s) built on the CPU worker, replayed on the GPU by hash")
    unsized = [e for e in extensions if e.status == "compiled" and e.artifact is None]
    sized = [e.artifact for e in extensions if e.status == "compiled" and e.artifact is not None]
    if unsized:
        reason += " (artifact size not measured: popkit compile FILE builds it, then popkit check sees its size)"
    elif sized:
        reason += (f" (artifact {sum(a.unpacked_bytes for a in sized) / 2**20:.2f} MiB, "
                   f"{sum(a.zipped_bytes for a in sized) / 2**20:.2f} MiB zipped: within 64 MiB / 1 MiB)")
    if cold_s is not None and cold_s > PRECOMPILE_TIMEOUT_S and status in ("compiled", "partial"):
        reason += (f"; but the cold build took {cold_s:.0f} s here, over the precompile's {PRECOMPILE_TIMEOUT_S:.0f} s "
                   "limit (MAX_JOBS=2): a CPU worker no faster times out and the build falls back to the GPU")
    key = None
    if env and all(e.argument_digest for e in extensions):
        key = _digest({"extensions": [e.argument_digest for e in extensions],
                       **{k: env.get(k, "") for k in ENVIRONMENT_KEYS}})
    return PrecompilePrediction(status, reason, extensions, device_lines, key, env, _pays(status, cold_s))


def _pays(status: str, cold_s: float | None) -> str:
    cost = f"{cold_s:.1f} s measured here" if cold_s is not None else "the cold build (popkit compile FILE measures it)"
    if status == "compiled":
        return "loading the cached extension only: no compile on the GPU"
    if status == "partial":
        return f"a GPU compile of the extensions that fall back, inside the ranked run's time ({cost} for all)"
    return f"a compile on the GPU inside the ranked run's time limit: {cost}"


def built_here(content: bytes, build_root: Path) -> tuple[Path, Mapping[str, Any]] | None:
    """The newest build `popkit compile` made of exactly these bytes under `build_root` (its folder and record)."""
    digest = hashlib.sha256(content).hexdigest()
    found = []
    for record in build_root.glob(f"*/{BUILD_RECORD}") if build_root.is_dir() else ():
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("sha256") == digest:
            found.append((data.get("written_at") or 0, record.parent, data))
    if not found:
        return None
    _when, folder, data = max(found, key=lambda f: f[0])
    return folder, data


def predict_file(path: Path, build_root: Path | None = None, content: bytes | None = None) -> PrecompilePrediction:
    """predict() for a file, with the artifact sizes, the environment and the cold build time of the newest
    `popkit compile` of the same bytes (under popkit's build folder), when there is one."""
    content = path.read_bytes() if content is None else content
    text = content.decode("utf-8", "replace")
    found = built_here(content, build_root if build_root is not None else popkit_home() / "build")
    if found is None:
        return predict(text)
    folder, record = found
    cold = record.get("cold_s")
    env = record.get("environment")
    return predict(text, build_dir=folder, environment=env if isinstance(env, dict) else None,
                   cold_s=cold if isinstance(cold, (int, float)) else None)
