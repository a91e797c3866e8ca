"""The one Jinja2 environment, and KernelSpec + task -> submission text (`popkit new`, `popkit templates`).

A rendered file is a whole submission: the `#!POPCORN` directives, a module-level `load_inline` build,
the kernel with its launch checked, and `custom_kernel(data)`. The word the server refuses (see
FORBIDDEN) never appears in a template, and render() refuses to return text that holds it.

Fast paths the templates choose (docs/tune.md): CUDA row_reduction stages its read-only `rows_of`
tensors in dynamic shared memory when the rows fit (the launcher falls back to three passes over global
memory otherwise); a CUDA matmul of two float16 operands is a WMMA tensor-core kernel (templates/common/
matmul_wmma.cu.j2, tunables TUNABLE["matmul_wmma"], kernelspec.tuning_key). Their locals start with `pk_`,
which spec names may not.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from popkit.errors import ExitCode, PopkitError, TaskError, UsageError
from popkit.model import leaderboards
from popkit.model import tasks
from popkit.model.gpus import AMD, DEFAULT_GPU, NVIDIA, TARGET_VENDOR, leaderboard_gpu, leaderboard_names
from popkit.model.leaderboards import Standing
from popkit.author.kernelspec import (  # noqa: F401  (re-exported: render is where callers find the spec API)
    DTYPES, GEOMETRIES, SCALAR_TYPES, SPEC_FILE, TARGETS, TUNABLE, TUNE_IF, KernelSpec, find_spec, infer_skeleton,
    load_spec, spec_for_task, spec_from_mapping, tunable_defaults, tuning_key,
)
from popkit.author.kernelspec import REDUCE_OPS
from popkit.model.tunespec import Constraint
from popkit.resources import data_dir, replace_file

if TYPE_CHECKING:
    import jinja2

FORBIDDEN = "str" + "eam"  # the server refuses any file containing it, in any case (docs/protocol-notes.md §6)
_RUNTIME = {  # launch-error API per target
    "cuda": {"error_t": "cudaError_t", "success": "cudaSuccess", "last_error": "cudaGetLastError",
             "error_string": "cudaGetErrorString", "runtime_header": "<cuda_runtime.h>", "label": "CUDA"},
    "hip": {"error_t": "hipError_t", "success": "hipSuccess", "last_error": "hipGetLastError",
            "error_string": "hipGetErrorString", "runtime_header": "<hip/hip_runtime.h>", "label": "HIP"},
}


@dataclass(frozen=True)
class Rendered:
    text: str
    task: str  # task directory name
    leaderboard: str
    target: str
    style: str
    gpu: str
    arch: str | None  # HIP offload architecture
    spec: str  # where the kernel came from ("vectoradd/kernel.yml", or the skeleton's source)
    skeleton: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Written:
    path: Path
    rendered: Rendered
    overwrote: bool
    standing: Standing | None = None  # the leaderboard of its directive, as it stands today
    warning: str = ""  # why a file for that leaderboard would not count today (leaderboards.advice), with a hint

    def to_json(self) -> dict[str, Any]:
        r = self.rendered
        return {"path": str(self.path), "task": r.task, "leaderboard": r.leaderboard, "target": r.target,
                "style": r.style, "gpu": r.gpu, "arch": r.arch, "spec": r.spec, "skeleton": r.skeleton,
                "overwrote": self.overwrote, "next": f"popkit test {self.path}",
                "standing": self.standing.to_json() if self.standing else None, "warning": self.warning or None}


@dataclass(frozen=True)
class TaskSpecInfo:
    task: str
    leaderboard: str
    path: str
    spec: str | None  # kernel.yml path, None when popkit renders a skeleton
    geometry: str | None
    error: str | None = None  # a kernel.yml that does not validate

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Catalog:
    targets: tuple[tuple[str, tuple[str, ...]], ...]  # (target, styles)
    tasks: tuple[TaskSpecInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"targets": {t: list(s) for t, s in self.targets}, "default_style": "inline",
                "geometries": list(GEOMETRIES), "tasks": [t.to_json() for t in self.tasks]}


# ------------------------------------------------------------------------------ the environment


@functools.lru_cache(maxsize=None)
def environment(root: str | None = None) -> jinja2.Environment:
    """The one Jinja2 environment: undefined variables are errors, trailing newlines are kept.

    Jinja2 is imported here, not at the top: every `popkit` command imports this module, few render."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(root or str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        autoescape=False,
    )


def template_names(root: Path | None = None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(target, styles) for every templates/<target>/<style>.py.j2."""
    base = root or data_dir("templates")
    out = []
    for target in TARGETS:
        styles = sorted(p.name[: -len(".py.j2")] for p in (base / target).glob("*.py.j2"))
        if styles:
            out.append((target, tuple(sorted(styles, key=lambda s: (s != "inline", s)))))
    return tuple(out)


def render_template(name: str, context: dict[str, Any], root: Path | None = None) -> str:
    """Render one template; a missing variable is a PopkitError naming the template and the variable."""
    import jinja2

    env = environment(str(root) if root else None)
    try:
        return env.get_template(name).render(**context)
    except jinja2.UndefinedError as exc:
        match = re.search(r"'([^']+)' (?:is undefined|has no attribute '([^']+)')", str(exc))
        var = (match.group(2) or match.group(1)) if match else str(exc)
        where = _template_frame(exc) or name
        raise PopkitError(f"template {where}: undefined variable `{var}`",
                          "the template and the context popkit builds disagree: a popkit bug, please report it",
                          exit_code=ExitCode.INTERNAL) from None
    except jinja2.TemplateNotFound as exc:
        raise UsageError(f"no template `{exc.name}`", "`popkit templates` lists targets and styles") from None


def _template_frame(exc: BaseException) -> str | None:
    """The innermost .j2 file in the traceback (jinja's own error does not say which include failed)."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            found = Path(filename).parent.name + "/" + Path(filename).name
        tb = tb.tb_next
    return found


# ------------------------------------------------------------------------------------ rendering


def render(task_dir: Path, *, leaderboard: str, target: str = "cuda", style: str = "inline",
           gpu: str | None = None, arch: str | None = None, gpus: Sequence[str] = (),
           root: Path | None = None) -> Rendered:
    """Render the submission for the task in `task_dir` (its kernel.yml, or a skeleton)."""
    styles = dict(template_names(root))
    if target not in styles:
        raise UsageError(f"unknown target `{target}`", "targets: " + ", ".join(styles))
    if style not in styles[target]:
        raise UsageError(f"unknown style `{style}` for target {target}", "styles: " + ", ".join(styles[target]))
    gpu = _choose_gpu(target, gpu, gpus)
    if arch is not None and target != "hip":
        raise UsageError("--arch applies to --target hip", "a CUDA build targets the GPU torch sees "
                         "(set TORCH_CUDA_ARCH_LIST to change it)")
    if target == "hip":
        arch = arch or (leaderboard_gpu(gpu) or leaderboard_gpu(DEFAULT_GPU[AMD])).arch
        if not re.fullmatch(r"gfx[0-9a-f]{3,4}", arch):
            raise UsageError(f"--arch {arch!r} is not an AMD architecture", "e.g. gfx942 (MI300) or gfx950 (MI355X)")
    spec = spec_for_task(Path(task_dir))
    context = build_context(spec, task=Path(task_dir).name, leaderboard=leaderboard.lower(), target=target,
                            style=style, gpu=gpu, arch=arch)
    text = render_template(f"{target}/{style}.py.j2", context, root)
    if FORBIDDEN in text.lower():  # a spec's body can carry it in; the server would refuse the file
        line = next(n for n, s in enumerate(text.splitlines(), 1) if FORBIDDEN in s.lower())
        raise TaskError(f"{spec.source}: the rendered file would contain `{FORBIDDEN}` (line {line})",
                        "the leaderboard refuses any file containing that word: rename it in the spec")
    return Rendered(text=text, task=Path(task_dir).name, leaderboard=leaderboard.lower(), target=target,
                    style=style, gpu=gpu, arch=arch, spec=spec.source, skeleton=spec.skeleton, notes=spec.notes)


def _choose_gpu(target: str, gpu: str | None, offered: Sequence[str]) -> str:
    vendor = leaderboard_names(TARGET_VENDOR[target])
    other = leaderboard_names(AMD if target == "cuda" else NVIDIA)
    if gpu is None:
        if offered and not any(g in vendor for g in offered):
            raise UsageError(f"the leaderboard offers no GPU that runs {target.upper()} code "
                             f"({', '.join(offered)})", f"use --target {'cuda' if target == 'hip' else 'hip'}")
        return next((g for g in offered if g in vendor), DEFAULT_GPU[TARGET_VENDOR[target]])
    if gpu in other:
        raise UsageError(f"--gpu {gpu} does not run {target.upper()} code",
                         f"use --target {'cuda' if target == 'hip' else 'hip'}, or one of: " + ", ".join(vendor))
    if offered and gpu not in offered:
        raise UsageError(f"--gpu {gpu} is not one of this leaderboard's GPUs ({', '.join(offered)})",
                         "the server refuses a GPU the leaderboard does not list")
    return gpu


def build_context(spec: KernelSpec, *, task: str, leaderboard: str, target: str, style: str, gpu: str,
                  arch: str | None) -> dict[str, Any]:
    """Everything the templates use, derived from the spec (the templates hold no task knowledge)."""
    ctype = {name: row[0 if target == "cuda" else 1] for name, row in DTYPES.items()}
    out, geo, fn = spec.output, spec.geometry, spec.function
    key = tuning_key(spec, target)
    headers = [_RUNTIME[target]["runtime_header"]] + (["<mma.h>"] if key == "matmul_wmma" else [])
    for dtype in dict.fromkeys([x.dtype for x in spec.inputs if x.is_tensor] + [out.dtype]):
        header = DTYPES[dtype][5 if target == "cuda" else 6]
        if header:
            headers.append(header)
    params, schema, kparams, kargs, checks, call_args = [], [], [], [], [], []
    for x in spec.inputs:
        if x.dtype == "object":
            continue
        call_args.append(x.name)
        if not x.is_tensor:
            cpp, sch = SCALAR_TYPES[x.dtype]
            params.append(f"{cpp} {x.name}")
            schema.append(f"{sch} {x.name}")
            kparams.append(f"{cpp} {x.name}")
            kargs.append(x.name)
            continue
        t, writes = ctype[x.dtype], out.reuse == x.name
        params.append(f"torch::Tensor {x.name}")
        schema.append(f"Tensor(a!) {x.name}" if writes else f"Tensor {x.name}")
        kparams.append(f"{'' if writes else 'const '}{t}* __restrict__ {x.name}")
        kargs.append(f"static_cast<{'' if writes else 'const '}{t}*>({x.name}.data_ptr())")
        checks.append(f'TORCH_CHECK({x.name}.is_cuda(), "{fn}: `{x.name}` must be a GPU tensor");')
        checks.append(f'TORCH_CHECK({x.name}.scalar_type() == {DTYPES[x.dtype][2]}, "{fn}: `{x.name}` must be '
                      f'{x.dtype}, got ", {x.name}.scalar_type());')
        checks.append(f'TORCH_CHECK({x.name}.is_contiguous(), "{fn}: `{x.name}` must be contiguous '
                      '(the kernel writes it in place)");' if writes else f"{x.name} = {x.name}.contiguous();")
    if not out.reuse:
        kparams.append(f"{ctype[out.dtype]}* __restrict__ {out.name}")
        kargs.append(f"static_cast<{ctype[out.dtype]}*>({out.name}.data_ptr())")
    for s in spec.scalars:
        kparams.append(f"{SCALAR_TYPES[s.type][0]} {s.name}")
        kargs.append(s.name)
    tensors = [x.name for x in spec.inputs if x.is_tensor]
    extents, launch = _geometry_code(spec, tensors, fn, checks)
    for name in extents["kernel"]:
        kparams.append(f"int64_t {name}")
        kargs.append(name)
    knames = [p.rsplit(" ", 1)[-1] for p in kparams]
    tune = _tune_context(spec, key)
    params += [f"int64_t {t['name']}" for t in tune["parameters"]]
    schema += [f"int {t['name']}" for t in tune["parameters"]]
    call_args += [t["name"] for t in tune["parameters"]]
    reductions = [{"name": r.name, "init": r.init, "op": REDUCE_OPS[r.op][0],
                   "accumulate": REDUCE_OPS[r.op][1].format(acc=r.name, value=r.value)} for r in spec.reductions]
    return {
        "task": task, "leaderboard": leaderboard, "gpu": gpu, "target": target, "style": style,
        "arch": arch, "source": spec.source, "skeleton": spec.skeleton, "notes": list(spec.notes),
        "rt": _RUNTIME[target], "headers": headers, "function": fn, "kernel": f"{fn}_kernel",
        "ext_name": f"popkit_{task}_{target}_{style}".replace("-", "_"), "namespace": f"popkit_{task}".replace("-", "_"),
        "params": params, "schema": f"{fn}({', '.join(schema)}) -> {'()' if out.reuse else 'Tensor'}",
        "returns": "void" if out.reuse else "torch::Tensor", "output": out.name, "reuse": out.reuse,
        "kernel_params": kparams, "kernel_args": kargs, "kernel_names": knames, "checks": checks,
        "alloc": _alloc(spec, tensors), **tune,
        "sizes": extents["host"], "scalars": [f"const {SCALAR_TYPES[s.type][0]} {s.name} = {s.value};"
                                              for s in spec.scalars],
        "launch": launch, "geometry": geo.kind,
        "rows_of": list(geo.rows_of), "reductions": reductions, "tensor_cores": key == "matmul_wmma",
        # CUDA row_reduction: the read-only rows copied to shared memory when they fit (one read of global memory)
        "staged": [{"name": r, "type": ctype[spec.input(r).dtype]} for r in geo.rows_of
                   if target == "cuda" and r in tensors and r != out.reuse],
        "body": spec.code("body", target), "finish": spec.code("finish", target),
        "load_a": DTYPES[spec.input(geo.a).dtype][4].format(f"{geo.a}[row * k + ak]") if geo.kind == "matmul" else "",
        "load_b": DTYPES[spec.input(geo.b).dtype][4].format(f"{geo.b}[bk * n + col]") if geo.kind == "matmul" else "",
        "matmul_a": geo.a, "matmul_b": geo.b,
        "unpack": f"{', '.join(x.name for x in spec.inputs)} = data" if spec.data == "tuple" else f"{spec.inputs[0].name} = data",
        "call_args": ", ".join(call_args), "fake": _fake(spec), "drop_dims": out.reduce_dims is not None,
        "data_doc": _data_doc(spec),
    }


def _tune_context(spec: KernelSpec, key: str) -> dict[str, Any]:
    """The tunable parameters of TUNABLE[key] (kernelspec.tuning_key): the `#!POPKIT tune` lines, the Python
    defaults, the kernel's template parameters and every grid point the extension compiles (those the tune-if
    keeps)."""
    tunables = TUNABLE[key]
    defaults = tunable_defaults(spec.geometry, key)
    rule = TUNE_IF.get(key, "")
    constraint = Constraint(rule, 0, "kernelspec.TUNE_IF") if rule else None
    points = []
    for combo in itertools.product(*(t.values for t in tunables)):
        values = dict(zip((t.name for t in tunables), combo))
        if constraint is None or constraint.holds(values):
            points.append({"cond": " && ".join(f"{k} == {v}" for k, v in values.items()),
                           "targs": ", ".join(map(str, combo))})
    return {
        "parameters": [{"name": t.name, "choices": ",".join(map(str, t.values)), "default": defaults[t.name],
                        "doc": t.doc} for t in tunables],
        "tune_if": rule, "grid_points": points,
        "tparams": ", ".join(f"int {t.name}" for t in tunables),
        "tnames": ", ".join(t.name for t in tunables),
    }


def _geometry_code(spec: KernelSpec, tensors: list[str], fn: str, checks: list[str]) -> tuple[dict, dict]:
    """Host-side extents, kernel extent arguments, and the launch configuration of one grid point (lines of the
    launcher template, in terms of the kernel's template parameters)."""
    geo = spec.geometry
    kind, over = geo.kind, geo.over
    if kind in ("elementwise_flat", "full_reduction"):
        if kind == "elementwise_flat" and not spec.skeleton:  # the body indexes every tensor with i
            for name in tensors:
                if name != over:
                    checks.append(f'TORCH_CHECK({name}.numel() == {over}.numel(), "{fn}: `{name}` and `{over}` '
                                  'must have the same number of elements");')
        cap = 65536 if kind == "elementwise_flat" else 1024  # grid-stride loops cover the rest
        host = [f"const int64_t n = {over}.numel();"]
        launch = {"lines": ["const dim3 block(BLOCK);",
                            "const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + BLOCK * VEC - 1) / "
                            f"(BLOCK * VEC), {cap})));"],
                  "guard": "n > 0"}
        return {"host": host, "kernel": ["n"]}, launch
    if kind == "elementwise_2d":
        checks.append(f'TORCH_CHECK({over}.dim() >= 2, "{fn}: `{over}` must have at least 2 dimensions");')
        host = [f"const int64_t rows = {over}.size(0);", f"const int64_t cols = {over}.size(1);"]
        launch = {"lines": ["const dim3 block(32, BLOCK / 32);",
                            "const int64_t blocks_y = std::min<int64_t>((rows + BLOCK / 32 * ROWS - 1) / "
                            "(BLOCK / 32 * ROWS), 65535);",
                            "const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), "
                            "static_cast<unsigned int>(blocks_y));"],
                  "guard": "rows > 0 && cols > 0"}
        return {"host": host, "kernel": ["rows", "cols"]}, launch
    if kind == "row_reduction":
        checks.append(f'TORCH_CHECK({over}.dim() >= 1, "{fn}: `{over}` must have at least 1 dimension");')
        host = [f"const int64_t cols = {over}.size(-1);", f"const int64_t rows = cols == 0 ? 0 : {over}.numel() / cols;"]
        launch = {"lines": ["const dim3 block(BLOCK);",
                            "const dim3 grid(static_cast<unsigned int>((rows + ROWS - 1) / ROWS));"],
                  "guard": "rows > 0"}
        return {"host": host, "kernel": ["rows", "cols"]}, launch
    a, bb = geo.a, geo.b
    checks.append(f'TORCH_CHECK({a}.dim() == 2 && {bb}.dim() == 2 && {a}.size(1) == {bb}.size(0), "{fn}: expected '
                  f'`{a}` (m, k) and `{bb}` (k, n), got ", {a}.sizes(), " and ", {bb}.sizes());')
    host = [f"const int64_t m = {a}.size(0);", f"const int64_t k = {a}.size(1);", f"const int64_t n = {bb}.size(1);"]
    launch = {"lines": ["const dim3 block(TILE, TILE / WPT);",
                        "const dim3 grid(static_cast<unsigned int>((n + TILE - 1) / TILE), "
                        "static_cast<unsigned int>((m + TILE - 1) / TILE));"],
              "guard": "m > 0 && n > 0"}
    return {"host": host, "kernel": ["m", "n", "k"]}, launch


def _alloc(spec: KernelSpec, tensors: list[str]) -> list[str]:
    """C++ lines that allocate the output (nothing for a reused one)."""
    out = spec.output
    if out.reuse:
        return []
    aten = DTYPES[out.dtype][2]
    factory = "zeros" if out.init == "zeros" else "empty"
    if out.like:
        same = spec.input(out.like).dtype == out.dtype
        extra = "" if same else f", {out.like}.options().dtype({aten})"
        return [f"torch::Tensor {out.name} = torch::{factory}_like({out.like}{extra});"]
    base = out.reduce_input or out.shape[0][0]
    options = f"{base}.options().dtype({aten})"
    if out.shape:
        dims = ", ".join(f"{name}.size({d})" for name, d in out.shape)
        return [f"torch::Tensor {out.name} = torch::{factory}({{{dims}}}, {options});"]
    if out.reduce_dims is None:
        return [f"torch::Tensor {out.name} = torch::{factory}(at::IntArrayRef{{}}, {options});"]
    src = out.reduce_input
    keep = " && ".join(f"d != {src}.dim() - {-d}" if d < 0 else f"d != {d}" for d in out.reduce_dims)
    return [f"std::vector<int64_t> {out.name}_sizes;",
            f"for (int64_t d = 0; d < {src}.dim(); ++d) {{",
            f"    if ({keep}) {out.name}_sizes.push_back({src}.size(d));",
            "}",
            f"torch::Tensor {out.name} = torch::{factory}({out.name}_sizes, {options});"]


def _fake(spec: KernelSpec) -> str:
    """The Python expression the fake (meta) implementation returns: the output's shape and dtype only."""
    out = spec.output
    if out.reuse:
        return "None"
    dtype = DTYPES[out.dtype][3]
    if out.like:
        same = spec.input(out.like).dtype == out.dtype
        return f"torch.empty_like({out.like})" if same else f"torch.empty_like({out.like}, dtype={dtype})"
    if out.shape:
        dims = ", ".join(f"{name}.shape[{d}]" for name, d in out.shape) + ("," if len(out.shape) == 1 else "")
        return f"{out.shape[0][0]}.new_empty(({dims}), dtype={dtype})"
    src = out.reduce_input
    if out.reduce_dims is None:
        return f"{src}.new_empty((), dtype={dtype})"
    return f"{src}.new_empty(_without_dims({src}.shape, {tuple(out.reduce_dims)!r}), dtype={dtype})"


def _data_doc(spec: KernelSpec) -> str:
    parts = [f"{x.name} ({x.dtype})" for x in spec.inputs]
    data = f"({', '.join(parts)})" if spec.data == "tuple" else parts[0]
    out = spec.output
    if out.reuse:
        returns = f"{out.name}, filled in place"
    elif out.like:
        returns = f"a new {out.dtype} tensor shaped like {out.like}"
    elif out.shape:
        returns = f"a new {out.dtype} tensor of shape ({', '.join(f'{n}.size({d})' for n, d in out.shape)})"
    elif out.reduce_dims is None:
        returns = f"a new 0-dim {out.dtype} tensor"
    else:
        returns = f"a new {out.dtype} tensor: {out.reduce_input} without dims {list(out.reduce_dims)}"
    return f"data: {data}; returns {returns}."


# ------------------------------------------------------------------------------ what commands call


def write(rendered: Rendered, path: Path, force: bool = False) -> Written:
    """Write the rendered text to `path`; an existing file is kept unless `force`."""
    path = Path(path)
    existed = path.exists()
    _check_output_path(path, force)
    replace_file(path, rendered.text.encode("utf-8"))  # nothing is written through a link put there meanwhile
    return Written(path=path, rendered=rendered, overwrote=existed)


def _check_output_path(path: Path, force: bool) -> None:
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link; popkit writes no file through a link",
                         "choose another path with -o, or remove the link")
    if path.is_dir():
        raise UsageError(f"{path} is a directory", "give a file path with -o, e.g. -o submission.py")
    if path.suffix != ".py":
        raise UsageError(f"{path}: a rendered submission is Python; name it *.py",
                         "the leaderboard picks the language from the extension")
    if path.exists() and not force:
        raise UsageError(f"{path} already exists; not overwriting it",
                         "pass --force to replace it, or choose another path with -o")


def new_submission(task: str, output: Path, *, target: str = "cuda", style: str = "inline",
                   gpu: str | None = None, arch: str | None = None, force: bool = False,
                   roots: Sequence[Path] = ()) -> Written:
    """`popkit new`: resolve the task, render its submission and write it (refusing to overwrite)."""
    _check_output_path(Path(output), force)
    found = tasks.resolve_task(task, list(roots))
    board = leaderboards.lookup(found.leaderboard or found.name, list(roots))
    # The leaderboard's own GPUs where a problem set names it (a practice task's list is popkit's own).
    offered = board.gpus if board.state in (leaderboards.OPEN, leaderboards.CLOSED) else found.gpus
    rendered = render(found.path, leaderboard=found.leaderboard or found.name, target=target, style=style,
                      gpu=gpu, arch=arch, gpus=offered)
    message, hint = leaderboards.advice(board, list(roots))
    return replace(write(rendered, Path(output), force), standing=board,
                   warning=f"{message}; {hint}" if message else "")


def catalog(roots: Sequence[Path] = ()) -> Catalog:
    """`popkit templates`: targets and styles, and which known tasks have a kernel.yml."""
    infos = []
    for task in tasks.list_tasks(list(roots)):
        path, geometry, error = find_spec(task.path), None, None
        if path:
            try:
                geometry = load_spec(path).geometry.kind
            except TaskError as exc:
                error = exc.message
        infos.append(TaskSpecInfo(task=task.name, leaderboard=task.leaderboard or task.name, path=str(task.path),
                                  spec=str(path) if path else None, geometry=geometry, error=error))
    return Catalog(targets=template_names(), tasks=tuple(infos))
