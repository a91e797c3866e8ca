"""KernelSpec: the declarative kernel.yml of a task, validated into frozen dataclasses (used by render.py).

A kernel.yml declares what a simple, correct kernel for a task needs; the templates derive the rest
(kernel signature, how `data` unpacks, output allocation or reuse, grid and block, the C++ wrapper,
`functions=` or the torch.library schema). Keys:

  function    C++ wrapper / operator name (default: the task directory's name)
  data        `tensor`: data is one tensor; `tuple`: data unpacks into `inputs`, in order
  inputs      [{name, dtype}]; dtype is a tensor dtype (float32, float16, bfloat16, float64, int32,
              int64, uint8, bool), `int`/`float` (a Python number passed to the kernel) or `object`
              (unpacked, not passed)
  output      {name, dtype, one of: like: INPUT | reduce: {input, dims: [..] | all} |
               shape: [INPUT.DIM, ..] | reuse: INPUT (preallocated in data), init: empty | zeros}
  scalars     [{name, type: int | float, value: C++ expression}] extra kernel arguments
  geometry    {kind: elementwise_flat | elementwise_2d | row_reduction | full_reduction | matmul,
               over: INPUT, block: threads, rows_of: [..] (row_reduction), a, b, tile (matmul)};
              `block` and `tile` are the starting values of the tunable BLOCK and TILE (TUNABLE); a float16
              x float16 matmul on CUDA tunes BM, BN, WARPS_M, WARPS_N, STAGES instead (tensor cores)
  reductions  [{name, op: sum | max | min, init, value}] (row_reduction: several; full_reduction: one)
  body        C++ statements per element (i; row, col, idx; j; row, col, acc), or {cuda: .., hip: ..}
  finish      C++ statements run once per block by thread 0 after the reductions
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from popkit.errors import TaskError
from popkit.model.refinputs import generated_inputs

TARGETS = ("cuda", "hip")
GEOMETRIES = ("elementwise_flat", "elementwise_2d", "row_reduction", "full_reduction", "matmul")
SPEC_FILE = "kernel.yml"

# dtype -> (CUDA type, HIP type, ATen scalar type, torch dtype, load-as-float format, CUDA header, HIP header)
DTYPES: dict[str, tuple[str, str, str, str, str, str | None, str | None]] = {
    "float32": ("float", "float", "at::kFloat", "torch.float32", "{}", None, None),
    "float16": ("__half", "__half", "at::kHalf", "torch.float16", "__half2float({})",
                "<cuda_fp16.h>", "<hip/hip_fp16.h>"),
    "bfloat16": ("__nv_bfloat16", "__hip_bfloat16", "at::kBFloat16", "torch.bfloat16", "__bfloat162float({})",
                 "<cuda_bf16.h>", "<hip/hip_bf16.h>"),
    "float64": ("double", "double", "at::kDouble", "torch.float64", "static_cast<float>({})", None, None),
    "int32": ("int32_t", "int32_t", "at::kInt", "torch.int32", "static_cast<float>({})", None, None),
    "int64": ("int64_t", "int64_t", "at::kLong", "torch.int64", "static_cast<float>({})", None, None),
    "uint8": ("uint8_t", "uint8_t", "at::kByte", "torch.uint8", "static_cast<float>({})", None, None),
    "bool": ("bool", "bool", "at::kBool", "torch.bool", "static_cast<float>({})", None, None),
}
SCALAR_TYPES = {"int": ("int64_t", "int"), "float": ("double", "float")}  # C++ type, schema type
REDUCE_OPS = {"sum": ("SumOp", "{acc} += {value};"), "max": ("MaxOp", "{acc} = fmaxf({acc}, {value});"),
               "min": ("MinOp", "{acc} = fminf({acc}, {value});")}
# Names the templates use inside the kernel and the wrapper; a spec's names must not shadow them.
RESERVED = frozenset({
    "i", "j", "n", "m", "k", "k0", "kk", "row", "col", "rows", "cols", "idx", "acc", "smem", "stride",
    "block", "grid", "blocks_y", "err", "data", "tile_a", "tile_b", "torch", "at", "std", "half", "float", "double",
    "int", "bool", "auto", "const", "void", "return", "new", "delete", "class", "struct", "this",
    "v", "w", "ty", "ak", "bk", "bv", "base", "first", "accs", "found", "BLOCK", "VEC", "ROWS", "TILE", "WPT",
    "BM", "BN", "WARPS_M", "WARPS_N", "STAGES", "nvcuda", "wmma",
})
RESERVED_PREFIX = "pk_"  # the templates' own locals (shared-memory rows, the tensor-core kernel) start with it
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Input:
    name: str
    dtype: str  # a DTYPES key, "int", "float" or "object"

    @property
    def is_tensor(self) -> bool:
        return self.dtype in DTYPES


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str
    like: str | None = None  # same shape as this input
    reduce_input: str | None = None  # this input's shape with `reduce_dims` removed
    reduce_dims: tuple[int, ...] | None = None  # None: every dimension (a 0-dim output)
    shape: tuple[tuple[str, int], ...] = ()  # (input, dim) per output dimension
    reuse: str | None = None  # the input preallocated in data that the kernel writes
    init: str = "empty"  # "empty" or "zeros"


@dataclass(frozen=True)
class Scalar:
    name: str
    type: str  # "int" or "float"
    value: str  # C++ expression evaluated in the wrapper


@dataclass(frozen=True)
class Reduction:
    name: str
    op: str  # sum, max, min
    init: str  # C++ expression
    value: str  # C++ expression per element


@dataclass(frozen=True)
class Geometry:
    kind: str
    over: str = ""  # the input whose extent sets the launch (not matmul)
    block: int = 256  # threads per block (elementwise_2d: 32 x block/32; matmul: tile x tile)
    rows_of: tuple[str, ...] = ()  # row_reduction: pointers advanced to the block's row
    a: str = ""  # matmul operands
    b: str = ""
    tile: int = 16


@dataclass(frozen=True)
class Tunable:
    """A launch parameter `popkit new` declares tunable (`#!POPKIT tune`); a template parameter of the kernel."""

    name: str
    values: tuple[int, ...]
    doc: str  # what it sets, for the comment beside the Python assignment


_BLOCKS = (64, 128, 256, 512, 1024)  # powers of two: block_reduce halves the block
_STEP = Tunable("VEC", (1, 2, 4, 8), "elements per thread per step, BLOCK apart (loads stay coalesced)")
# Every point of a geometry's grid is compiled into the extension (the launcher dispatches on the values the
# Python file passes at each call), so all variants of a rendered file share one build.
TUNABLE: dict[str, tuple[Tunable, ...]] = {
    "elementwise_flat": (Tunable("BLOCK", _BLOCKS, "threads per block"), _STEP),
    "full_reduction": (Tunable("BLOCK", _BLOCKS, "threads per block"), _STEP),
    "elementwise_2d": (Tunable("BLOCK", _BLOCKS, "threads per block: 32 columns by BLOCK/32 rows"),
                       Tunable("ROWS", (1, 2, 4), "rows per thread per step, BLOCK/32 apart")),
    "row_reduction": (Tunable("BLOCK", _BLOCKS, "threads per block, all on one row at a time"),
                      Tunable("ROWS", (1, 2, 4, 8), "rows per block, one after another")),
    "matmul": (Tunable("TILE", (8, 16, 32), "output tile per block: TILE x TILE, k in steps of TILE"),
               Tunable("WPT", (1, 2, 4, 8), "outputs per thread, TILE/WPT rows apart (TILE x TILE/WPT threads)")),
    # matmul of two float16 operands on CUDA: WMMA tensor cores (see tuning_key).
    "matmul_wmma": (Tunable("BM", (64, 128), "output rows per block"),
                    Tunable("BN", (64, 128), "output columns per block"),
                    Tunable("WARPS_M", (2, 4), "warps along m: each owns BM/WARPS_M rows"),
                    Tunable("WARPS_N", (2, 4), "warps along n: each owns BN/WARPS_N columns"),
                    Tunable("STAGES", (2, 3), "k slices of 32 in shared memory (cp.async pipeline depth)")),
}
# At least one warp of threads per block: a smaller matmul block leaves most of each warp idle.
# matmul_wmma: at most 8 warps, and no warp tile of 64 x 64 (its accumulators alone fill the 255 registers of a thread).
TUNE_IF: dict[str, str] = {"matmul": "TILE * TILE // WPT >= 32",
                           "matmul_wmma": "WARPS_M * WARPS_N <= 8 and BM * BN // (WARPS_M * WARPS_N) <= 2048"}
_WMMA_START = {"BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "STAGES": 2}  # submissions/matmul/cuda.py's


def tuning_key(spec: "KernelSpec", target: str) -> str:
    """The TUNABLE key of a spec rendered for `target`: its geometry, or matmul_wmma for float16 x float16 on CUDA."""
    geo = spec.geometry
    if geo.kind == "matmul" and target == "cuda" and spec.input(geo.a).dtype == spec.input(geo.b).dtype == "float16":
        return "matmul_wmma"
    return geo.kind


def tunable_defaults(geometry: "Geometry", key: str | None = None) -> dict[str, int]:
    """The value each tunable parameter of `geometry` (under TUNABLE key `key`) starts at in a rendered file."""
    start = {"BLOCK": geometry.block, "TILE": geometry.tile, **_WMMA_START}
    return {t.name: start.get(t.name, 1) for t in TUNABLE[key or geometry.kind]}


@dataclass(frozen=True)
class KernelSpec:
    function: str
    data: str  # "tensor" or "tuple"
    inputs: tuple[Input, ...]
    output: Output
    geometry: Geometry
    body: tuple[tuple[str, str], ...] = ()  # (target, C++ statements)
    finish: tuple[tuple[str, str], ...] = ()
    scalars: tuple[Scalar, ...] = ()
    reductions: tuple[Reduction, ...] = ()
    source: str = ""  # where the spec came from, for the rendered header
    notes: tuple[str, ...] = field(default_factory=tuple)  # skeletons: what the user fills in
    skeleton: bool = False

    def input(self, name: str) -> Input:
        return next(x for x in self.inputs if x.name == name)

    def code(self, which: str, target: str) -> str:
        return dict(getattr(self, which)).get(target, "")


# ------------------------------------------------------------------------------------ loading


class _Check:
    """Validation that names the spec file and the key in every message."""

    def __init__(self, label: str, path: Path | None):
        self.label, self.path = label, path

    def fail(self, key: str, message: str) -> TaskError:
        return TaskError(f"{self.label}: key `{key}` {message}", f"in {self.path}" if self.path else "")

    def need(self, ok: bool, key: str, wanted: str, got: Any) -> None:
        if not ok:
            shown = "nothing" if got is None else f"{type(got).__name__} {got!r}"
            raise self.fail(key, f"must be {wanted} (got {shown})")

    def ident(self, raw: Any, key: str, taken: set[str]) -> str:
        self.need(isinstance(raw, str) and bool(_IDENT.match(raw)), key, "a C identifier", raw)
        if raw in RESERVED or keyword.iskeyword(raw) or raw.startswith(RESERVED_PREFIX):
            raise self.fail(key, f"`{raw}` is reserved (the templates use it); choose another name")
        if raw in taken:
            raise self.fail(key, f"`{raw}` is already used by another input, scalar or reduction")
        taken.add(raw)
        return raw

    def code(self, raw: Any, key: str) -> tuple[tuple[str, str], ...]:
        if raw is None:
            return ()
        if isinstance(raw, str):
            return tuple((t, raw.rstrip()) for t in TARGETS)
        self.need(isinstance(raw, Mapping) and set(raw) <= set(TARGETS) and all(isinstance(v, str) for v in raw.values()),
                  key, "C++ statements, or a mapping of cuda/hip to statements", raw)
        return tuple((t, raw[t].rstrip()) for t in TARGETS if t in raw)


def load_spec(path: Path | str) -> KernelSpec:
    """Load and validate a kernel.yml; every error names the file and the key."""
    path = Path(path)
    label = f"{path.parent.name}/{path.name}"
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"{label}: not found", f"looked for {path}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise TaskError(f"{label}: {where}invalid YAML ({getattr(exc, 'problem', None) or exc})",
                        f"in {path}") from None
    return spec_from_mapping(raw, label=label, path=path)


def spec_from_mapping(raw: Any, *, label: str = SPEC_FILE, path: Path | None = None) -> KernelSpec:
    c = _Check(label, path)
    if not isinstance(raw, Mapping):
        raise TaskError(f"{label}: must be a mapping of keys", f"in {path}" if path else "")
    known = {"function", "data", "inputs", "output", "scalars", "geometry", "reductions", "body", "finish"}
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        raise c.fail(unknown[0], "is unknown (known: " + ", ".join(sorted(known)) + ")")
    taken: set[str] = set()
    function = c.ident(raw.get("function", path.parent.name if path else None), "function", set())
    data = raw.get("data", "tuple")
    c.need(data in ("tensor", "tuple"), "data", "`tensor` or `tuple`", data)
    inputs_raw = raw.get("inputs")
    c.need(isinstance(inputs_raw, list) and inputs_raw, "inputs", "a non-empty list", inputs_raw)
    if data == "tensor":
        c.need(len(inputs_raw) == 1, "inputs", "one input when `data: tensor`", inputs_raw)
    inputs = []
    for n, item in enumerate(inputs_raw):
        c.need(isinstance(item, Mapping), f"inputs[{n}]", "a mapping with name and dtype", item)
        name = c.ident(item.get("name"), f"inputs[{n}].name", taken)
        dtype = item.get("dtype")
        c.need(dtype in DTYPES or dtype in SCALAR_TYPES or dtype == "object", f"inputs[{n}].dtype",
               "one of " + ", ".join([*DTYPES, *SCALAR_TYPES, "object"]), dtype)
        inputs.append(Input(name, dtype))
    if data == "tensor":
        c.need(inputs[0].is_tensor, "inputs[0].dtype", "a tensor dtype when `data: tensor`", inputs[0].dtype)
    tensors = {x.name: x for x in inputs if x.is_tensor}
    output = _output(c, raw.get("output"), tensors, taken)
    scalars = []
    for n, item in enumerate(raw.get("scalars") or []):
        c.need(isinstance(item, Mapping), f"scalars[{n}]", "a mapping with name, type and value", item)
        name = c.ident(item.get("name"), f"scalars[{n}].name", taken)
        c.need(item.get("type") in SCALAR_TYPES, f"scalars[{n}].type", "`int` or `float`", item.get("type"))
        c.need(isinstance(item.get("value"), (str, int, float)), f"scalars[{n}].value", "a C++ expression",
               item.get("value"))
        scalars.append(Scalar(name, item["type"], str(item["value"])))
    geometry = _geometry(c, raw.get("geometry"), tensors, output)
    reductions = []
    for n, item in enumerate(raw.get("reductions") or []):
        c.need(isinstance(item, Mapping), f"reductions[{n}]", "a mapping with name, op, init and value", item)
        name = c.ident(item.get("name"), f"reductions[{n}].name", taken)
        c.need(item.get("op") in REDUCE_OPS, f"reductions[{n}].op", "`sum`, `max` or `min`", item.get("op"))
        for key in ("init", "value"):
            c.need(isinstance(item.get(key), (str, int, float)), f"reductions[{n}].{key}", "a C++ expression",
                   item.get(key))
        reductions.append(Reduction(name, item["op"], str(item["init"]), str(item["value"])))
    kind = geometry.kind
    if kind == "row_reduction":
        c.need(bool(reductions), "reductions", "a non-empty list for `row_reduction`", raw.get("reductions"))
    elif kind == "full_reduction":
        c.need(len(reductions) == 1, "reductions", "exactly one reduction for `full_reduction` (blocks cannot "
               "wait for each other between two)", raw.get("reductions"))
    elif reductions:
        raise c.fail("reductions", f"is only for row_reduction and full_reduction (geometry is {kind})")
    body, finish = c.code(raw.get("body"), "body"), c.code(raw.get("finish"), "finish")
    if kind == "full_reduction":
        c.need(bool(finish), "finish", "C++ statements that store the block's result (e.g. atomicAdd)", None)
        if body:
            raise c.fail("body", "is not used by full_reduction (put the per-block store in `finish`)")
    elif not body and not (kind == "row_reduction" and finish):
        c.need(False, "body", "C++ statements that write the output", None)
    if finish and kind not in ("row_reduction", "full_reduction"):
        raise c.fail("finish", f"is only for row_reduction and full_reduction (geometry is {kind})")
    return KernelSpec(function=function, data=data, inputs=tuple(inputs), output=output, geometry=geometry,
                      body=body, finish=finish, scalars=tuple(scalars), reductions=tuple(reductions),
                      source=label)


def _output(c: _Check, raw: Any, tensors: Mapping[str, Input], taken: set[str]) -> Output:
    c.need(isinstance(raw, Mapping), "output", "a mapping", raw)
    forms = [k for k in ("like", "reduce", "shape", "reuse") if k in raw]
    if len(forms) != 1:
        raise c.fail("output", "needs exactly one of `like`, `reduce`, `shape`, `reuse` "
                     f"(got {', '.join(forms) or 'none'})")
    init = raw.get("init", "empty")
    c.need(init in ("empty", "zeros"), "output.init", "`empty` or `zeros`", init)

    def tensor_name(value: Any, key: str) -> str:
        c.need(value in tensors, key, "the name of a tensor input (" + ", ".join(tensors) + ")", value)
        return value

    if "reuse" in raw:
        source = tensor_name(raw["reuse"], "output.reuse")
        if raw.get("name", source) != source:
            raise c.fail("output.name", "must be the reused input's name (or left out)")
        c.need(init == "empty", "output.init", "`empty` for a reused output (the harness owns it)", init)
        return Output(name=source, dtype=tensors[source].dtype, reuse=source)
    name = c.ident(raw.get("name"), "output.name", taken)
    dtype = raw.get("dtype")
    c.need(dtype in DTYPES, "output.dtype", "one of " + ", ".join(DTYPES), dtype)
    if "like" in raw:
        return Output(name, dtype, like=tensor_name(raw["like"], "output.like"), init=init)
    if "reduce" in raw:
        red = raw["reduce"]
        c.need(isinstance(red, Mapping), "output.reduce", "a mapping with input and dims", red)
        source = tensor_name(red.get("input"), "output.reduce.input")
        dims = red.get("dims")
        if dims == "all":
            return Output(name, dtype, reduce_input=source, reduce_dims=None, init=init)
        c.need(isinstance(dims, list) and dims and all(isinstance(d, int) and not isinstance(d, bool) for d in dims),
               "output.reduce.dims", "a list of dimension indices, or `all`", dims)
        return Output(name, dtype, reduce_input=source, reduce_dims=tuple(dims), init=init)
    shape = raw["shape"]
    c.need(isinstance(shape, list) and shape, "output.shape", "a list like [a.0, b.1]", shape)
    dims = []
    for n, item in enumerate(shape):
        parts = str(item).split(".")
        ok = len(parts) == 2 and parts[0] in tensors and parts[1].lstrip("-").isdigit()
        c.need(ok, f"output.shape[{n}]", "INPUT.DIM with a tensor input's name, e.g. a.0", item)
        dims.append((parts[0], int(parts[1])))
    return Output(name, dtype, shape=tuple(dims), init=init)


def _geometry(c: _Check, raw: Any, tensors: Mapping[str, Input], output: Output) -> Geometry:
    c.need(isinstance(raw, Mapping), "geometry", "a mapping with `kind`", raw)
    kind = raw.get("kind")
    c.need(kind in GEOMETRIES, "geometry.kind", "one of " + ", ".join(GEOMETRIES), kind)
    allowed = {"kind", "over", "block", "rows_of"} | ({"a", "b", "tile"} if kind == "matmul" else set())
    extra = sorted(set(map(str, raw)) - allowed)
    if extra:
        raise c.fail(f"geometry.{extra[0]}", f"is not a key of geometry `{kind}`")
    names = [*tensors, *([output.name] if not output.reuse else [])]
    if kind == "matmul":
        a, b = raw.get("a", next(iter(tensors), None)), raw.get("b", list(tensors)[1] if len(tensors) > 1 else None)
        c.need(a in tensors, "geometry.a", "a tensor input", a)
        c.need(b in tensors and b != a, "geometry.b", "another tensor input", b)
        tile = raw.get("tile", 16)
        c.need(tile in (8, 16, 32), "geometry.tile", "8, 16 or 32", tile)
        return Geometry(kind, a=a, b=b, tile=tile, block=tile * tile)
    over = raw.get("over", next(iter(tensors), None))
    c.need(over in tensors, "geometry.over", "a tensor input (its extent sets the launch)", over)
    block = raw.get("block", 256)
    c.need(isinstance(block, int) and block in (64, 128, 256, 512, 1024), "geometry.block",
           "a power of two from 64 to 1024", block)
    rows_of: tuple[str, ...] = ()
    if kind == "row_reduction":
        default = [over] + ([output.name] if output.like == over or output.reuse else [])
        rows = raw.get("rows_of", default)
        c.need(isinstance(rows, list) and all(r in names for r in rows), "geometry.rows_of",
               "a list of tensor names (" + ", ".join(names) + ")", rows)
        rows_of = tuple(dict.fromkeys(rows))
    elif "rows_of" in raw:
        raise c.fail("geometry.rows_of", "is only for row_reduction")
    return Geometry(kind, over=over, block=block, rows_of=rows_of)


# ------------------------------------------------------------------------------------ skeletons


def infer_skeleton(task_dir: Path) -> KernelSpec:
    """A spec for a task without kernel.yml: `data` unpacks as the reference's generate_input returns it
    (refinputs.py), else as task.py's `input_t` says, as far as either says.

    Tensor dtypes come from generate_input's torch calls; from an annotation they are unknown, so they are
    assumed float32 and the wrapper checks that; the kernel copies the first tensor into a new output. The
    notes say what to fill in.
    """
    layout, described = _input_layout(Path(task_dir) / "task.py")
    notes = [f"Skeleton: {Path(task_dir).name} has no {SPEC_FILE}; {described}."]
    generated = generated_inputs(Path(task_dir) / "reference.py")
    scalar = {"tensor": "float32", "int": "int", "float": "float"}
    if generated and any(g.dtype in DTYPES for g in generated):
        data = "tuple" if len(generated) > 1 else "tensor"
        inputs = [Input(f"in{n}" if data == "tuple" else "x", g.dtype if g.dtype in DTYPES else "object")
                  for n, g in enumerate(generated)]
        shown = ", ".join(f"{g.name} ({g.dtype or 'not a tensor popkit reads'})" for g in generated)
        notes.append(f"reference.py's generate_input returns {shown}: custom_kernel unpacks that"
                     + ("" if layout is None or len(layout) == len(generated) else
                        f" (task.py's input_t names {len(layout)} values; generate_input is what data holds)") + ".")
    elif layout is None or not any(kind == "tensor" for kind in layout):
        notes.append("data is assumed to be one tensor: change the unpacking in custom_kernel if it is not.")
        data, inputs = "tensor", [Input("x", "float32")]
    else:
        data = "tuple" if len(layout) > 1 or described.startswith("input_t is a tuple") else "tensor"
        inputs = [Input(f"in{n}" if data == "tuple" else "x", scalar.get(kind, "object"))
                  for n, kind in enumerate(layout)]
    first = next(x for x in inputs if x.is_tensor)
    assumed = "" if generated and any(g.dtype in DTYPES for g in generated) else " (assumed float32; the wrapper checks it)"
    notes += [
        f"Fill in: each tensor's dtype{assumed}, the output's shape and",
        f"dtype (now those of {first.name}), the launch geometry, and the kernel body (now a copy of {first.name}).",
        "The task's reference.py shows what custom_kernel must return.",
    ]
    body = f"out[i] = {first.name}[i];  // Fill in: compute out[i] from the inputs."
    return KernelSpec(
        function=re.sub(r"\W", "_", Path(task_dir).name).strip("_").lower() or "kernel",
        data=data, inputs=tuple(inputs), output=Output("out", first.dtype, like=first.name),
        geometry=Geometry("elementwise_flat", over=first.name), body=tuple((t, body) for t in TARGETS),
        source="reference.py and task.py (no kernel.yml)" if generated else "task.py (no kernel.yml)",
        notes=tuple(notes), skeleton=True,
    )


def _input_layout(task_py: Path) -> tuple[list[str] | None, str]:
    """(element kinds of `data`, or None when unknown; a sentence saying what was found)."""
    try:
        tree = ast.parse(task_py.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None, "task.py is missing or unreadable, so data's layout is unknown"
    annotation = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "input_t":
            return None, "input_t is a class (a dict-like or named layout popkit does not unpack)"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "input_t" for t in targets) and node.value is not None:
            annotation = node.value
            if isinstance(annotation, ast.Call) and _dotted(annotation.func).endswith("TypeVar"):
                annotation = next((kw.value for kw in annotation.keywords if kw.arg == "bound"), None)
    if annotation is None:
        return None, "task.py defines no input_t annotation popkit can read"
    shown = ast.unparse(annotation)
    if _is_tensor(annotation):
        return ["tensor"], f"input_t is one tensor ({shown})"
    if isinstance(annotation, ast.Subscript) and _dotted(annotation.value).split(".")[-1] in ("tuple", "Tuple"):
        elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts):
            return None, f"input_t is a tuple of any length ({shown})"
        kinds = ["tensor" if _is_tensor(e) else _dotted(e) if _dotted(e) in ("int", "float") else "object"
                 for e in elts]
        return kinds, f"input_t is a tuple ({shown})"
    return None, f"input_t is {shown}, which popkit does not unpack"


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_tensor(node: ast.AST) -> bool:
    return _dotted(node) in ("torch.Tensor", "Tensor")


def find_spec(task_dir: Path) -> Path | None:
    path = Path(task_dir) / SPEC_FILE
    return path if path.is_file() else None


def spec_for_task(task_dir: Path) -> KernelSpec:
    """The task's kernel.yml, or an inferred skeleton when it has none."""
    path = find_spec(task_dir)
    return load_spec(path) if path else infer_skeleton(task_dir)


__all__: Sequence[str] = (
    "DTYPES", "GEOMETRIES", "Geometry", "Input", "KernelSpec", "Output", "Reduction", "Scalar", "TARGETS",
    "TUNABLE", "TUNE_IF", "Tunable", "tunable_defaults", "tuning_key",
    "find_spec", "infer_skeleton", "load_spec", "spec_for_task", "spec_from_mapping",
)
