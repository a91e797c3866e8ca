"""What `popkit tune` learns in a child process without building or timing anything.

- `build_identities`: which variants build the same extension. One interpreter imports every variant
  with torch's `load_inline`/`load` replaced by a recorder, so nothing compiles, and keys each variant by
  what it would hand the toolchain (name, sources, flags). Variants with one key share one build (a file
  rendered by `popkit new` compiles its whole grid, so every variant has the same key); a variant whose
  import the recorder could not follow gets a key of its own (its own build, never a shared one).
- `input_shapes`: the shapes of the tensors of each benchmark input, from the task's `generate_input`,
  for the per-shape dispatch of the file tune writes.

Both run under proc.run (watchdog, timeout) in a working directory laid out as the runner lays it out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit.model.tasks import Task
from popkit.run import runner
from popkit.toolchain import prestep

PROBE_DRIVER, SHAPES_DRIVER = "_popkit_tune_probe.py", "_popkit_tune_shapes.py"  # run as scripts in a workspace
RESULT = ".popkit-tune-result.json"  # written in the workspace's working folder
PROBE_TIMEOUT_S = 120.0  # one interpreter: importing torch, then each variant's module-level code
PER_VARIANT_S = 5.0

_BUILD_DRIVER = r'''
import hashlib, importlib.util, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
names, result_path = json.loads(sys.argv[1]), sys.argv[2]
results = {}
try:
    import torch.utils.cpp_extension as ext
    import torch.library
except BaseException as exc:
    json.dump({"error": f"{type(exc).__name__}: {exc}"}, open(result_path, "w"))
    raise SystemExit(0)

class Stand:
    """Stands for what load_inline would return; the variant's import goes on past it."""
    def __getattr__(self, name): return Stand()
    def __call__(self, *args, **kwargs): return Stand()

calls = []
def recorder(kind):
    def record(*args, **kwargs):
        kwargs.pop("verbose", None)
        if kind == "load":  # sources are files: their bytes, not their paths, decide the build
            calls.append({"kind": kind, "incomplete": True})
            return Stand()
        calls.append({"kind": kind, "name": str(kwargs.get("name", args[0] if args else "")),
                      "key": hashlib.sha256(repr((kind, args, sorted(kwargs.items()))).encode()).hexdigest()})
        return Stand()
    return record

ext.load_inline, ext.load = recorder("load_inline"), recorder("load")
torch.library.register_fake = lambda *a, **k: (lambda fn: fn)  # the operator was never loaded
for name in names:
    calls.clear()
    error = ""
    try:
        spec = importlib.util.spec_from_file_location("submission", name)
        module = importlib.util.module_from_spec(spec)
        sys.modules["submission"] = module
        spec.loader.exec_module(module)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    results[name] = {"calls": list(calls), "error": error}
json.dump(results, open(result_path, "w"))
'''

_SHAPES_DRIVER = r'''
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
cases, result_path = json.loads(sys.argv[1]), sys.argv[2]
def shapes(data):
    if hasattr(data, "shape") and hasattr(data, "dtype"):
        return [list(data.shape)]
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, (tuple, list)):
        return [s for item in data for s in shapes(item)]
    return []
try:
    from reference import generate_input
    found = []
    for case in cases:
        data = generate_input(**case)
        found.append(shapes(data))
        del data
    out = {"shapes": found}
except BaseException as exc:
    out = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
json.dump(out, open(result_path, "w"))
'''


@dataclass(frozen=True)
class Identity:
    """What one variant hands the toolchain: `key` is equal for variants that build the same extension."""

    key: str | None  # None: the variant builds nothing
    shared: bool  # False: the recorder could not follow the import, so the variant builds on its own
    names: tuple[str, ...] = ()  # the extension names
    note: str = ""


def _env_key(options: runner.RunOptions) -> str:
    """What else changes a build: the interpreter and the build environment the evals get."""
    env = runner.child_env(options)
    return "\0".join([options.python] + [f"{k}={env.get(k, '')}" for k in prestep.BUILD_ENV
                                         if k not in ("TORCH_EXTENSIONS_DIR", "PATH")])


def build_identities(task: Task, contents: Sequence[bytes], options: runner.RunOptions) -> list[Identity]:
    """One Identity per content (same order); a file with nothing to build is known without a child."""
    out: list[Identity | None] = [None if prestep.needs_build(c) else Identity(None, True) for c in contents]
    todo = [i for i, found in enumerate(out) if found is None]
    if not todo:
        return out  # type: ignore[return-value]
    results: Mapping[str, Any] = {}
    problem = ""
    session = runner.RunSession(task, None, "test", options, content=contents[todo[0]], check=False)
    with session.opened("popkit-tune-probe-", preflight=False, set_up=False):
        session.place()
        names = []
        for i in todo:
            name = f"_popkit_variant_{i:04d}.py"
            session.workspace.add(name, contents[i])
            names.append(name)
        timeout = PROBE_TIMEOUT_S + PER_VARIANT_S * len(names)
        done = session.script(PROBE_DRIVER, _BUILD_DRIVER.encode(), [json.dumps(names), RESULT], timeout)
        code, err, timed_out = done.code, done.stderr, done.timed_out
        try:
            results = json.loads((session.workspace.cwd / RESULT).read_text())
        except (OSError, ValueError):
            problem = "timed out" if timed_out else f"exited {code}: {err.strip()[-200:]}"
    if results.get("error"):
        problem = str(results["error"])
    env_key = _env_key(options)
    for i, name in zip(todo, (f"_popkit_variant_{i:04d}.py" for i in todo)):
        own = hashlib.sha256(contents[i]).hexdigest()
        found = results.get(name) if not problem else None
        if not isinstance(found, Mapping):
            out[i] = Identity(_key(own, env_key), False, note=f"build probe failed ({problem or 'no result'})")
            continue
        calls = [c for c in found.get("calls", []) if isinstance(c, Mapping)]
        if not calls and not found.get("error"):
            out[i] = Identity(None, True)
        elif any(c.get("incomplete") for c in calls) or not calls:
            why = "it builds with load() from source files" if calls else f"its import stopped: {found.get('error')}"
            out[i] = Identity(_key(own, env_key), False, note=f"builds on its own: {why}")
        else:
            # An import that stopped after the builds (on what stands for the built module) stops the same way
            # in every variant that reaches it the same way; the error is part of the key.
            digest = json.dumps([c["key"] for c in calls] + [found.get("error", "")])
            out[i] = Identity(_key(digest, env_key), True, tuple(dict.fromkeys(str(c.get("name")) for c in calls)))
    return out  # type: ignore[return-value]


def _key(text: str, env_key: str) -> str:
    return hashlib.sha256(f"{text}\0{env_key}".encode()).hexdigest()


def input_shapes(task: Task, options: runner.RunOptions, content: bytes,
                 timeout_s: float = PROBE_TIMEOUT_S) -> tuple[list[tuple[tuple[int, ...], ...]] | None, str]:
    """The tensor shapes of each benchmark input (task order) from the task's reference.generate_input;
    (None, why) when it cannot be learned."""
    cases = task.cases_for("benchmark")
    if task.multi_gpu:
        return None, "a multi-GPU task's inputs are made per rank"
    session = runner.RunSession(task, None, "test", options, content=content, check=False)
    with session.opened("popkit-tune-shapes-", preflight=False, set_up=False):
        session.place()
        if not (session.workspace.files / "reference.py").is_file():
            return None, "the task has no reference.py with generate_input"
        done = session.script(SHAPES_DRIVER, _SHAPES_DRIVER.encode(), [json.dumps(list(map(dict, cases))), RESULT],
                              timeout_s)
        code, err, timed_out = done.code, done.stderr, done.timed_out
        try:
            found = json.loads((session.workspace.cwd / RESULT).read_text())
        except (OSError, ValueError):
            return None, "generate_input " + ("timed out" if timed_out else f"exited {code}: {err.strip()[-200:]}")
    if "error" in found:
        return None, f"generate_input failed: {found['error']}"
    return [tuple(tuple(int(d) for d in shape) for shape in item) for item in found["shapes"]], ""


def build_dir(root: Path, key: str) -> Path:
    """The extensions folder (TORCH_EXTENSIONS_DIR) of one build key."""
    return root / f"tune-{key[:16]}"


__all__ = ["Identity", "build_dir", "build_identities", "input_shapes"]
