"""popkit risk, the trusted side: each case's margin to the task's tolerance and its determinism, judged by a
process that never imports the submission.

Runs beside the task's files only (reference.py and what it imports; no submission file is there). Usage:
judge.py PLAN_JSON OUT_FOLDER, with POPKIT_RISK_FD naming the pipe its one JSON document goes to. For each planned
case it calls the task's own `generate_input` (a case it refuses is not a case), reads the outputs the submission's
side wrote (run_submission.py: raw bytes and a JSON header, read as data, never unpickled) and calls the task's own
`check_implementation`. The margin is the smallest factor on the tolerance at which the check still passes: every
function of reference.py's namespace taking `rtol` and `atol` (utils.compare, verbose_allclose) gets them multiplied
by the factor, found by bisection; for the element-wise rule |out - ref| <= atol + rtol*|ref| that factor is the
worst error over its tolerance. A check with no such function has no margin (null), only its verdict.
"""

import hashlib
import inspect
import json
import math
import os
import stat
import sys

import torch

STEPS = 18  # bisection steps: the margin to within 2**-18 of the tolerance
MAX_SCALE = 4.0 ** 10  # beyond this a failing case's margin is not sought (null)
MAX_FILE_BYTES = 4 << 30
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
          "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


class Tolerance:
    """reference.py's tolerance functions, their rtol and atol multiplied by `scale`."""

    def __init__(self, module):
        self.module = module
        self.scale = 1.0
        self.patched = []
        for name, value in list(vars(module).items()):
            if not callable(value) or isinstance(value, type):
                continue
            try:
                signature = inspect.signature(value)
            except (TypeError, ValueError):
                continue
            if {"rtol", "atol"} <= set(signature.parameters):
                setattr(module, name, self._scaled(value, signature))
                self.patched.append(name)

    def _scaled(self, function, signature):
        def scaled(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for key in ("rtol", "atol"):
                if isinstance(bound.arguments.get(key), (int, float)):
                    bound.arguments[key] = bound.arguments[key] * self.scale
            return function(*bound.args, **bound.kwargs)
        return scaled


def _verdict(result):
    """(ok, message) from check_implementation's answer: a pair, or (older tasks) a string, empty meaning pass."""
    if isinstance(result, tuple) and len(result) == 2:
        return bool(result[0]), str(result[1])
    if isinstance(result, str):
        return not result, result
    return bool(result), ""


def check(data, output, tolerance, scale):
    tolerance.scale = scale
    try:
        return _verdict(tolerance.module.check_implementation(data, output))
    except Exception as e:
        return False, f"check_implementation raised {type(e).__name__}: {e}"


def margin(data, output, tolerance):
    """The smallest factor on the tolerance at which the check passes (None: no tolerance, or beyond MAX_SCALE)."""
    if not tolerance.patched:
        return None
    if check(data, output, tolerance, 0.0)[0]:
        return 0.0
    low, high = 0.0, 1.0
    while not check(data, output, tolerance, high)[0]:
        low, high = high, high * 4
        if high > MAX_SCALE:
            return None
    for _ in range(STEPS):
        middle = (low + high) / 2
        if check(data, output, tolerance, middle)[0]:
            high = middle
        else:
            low = middle
    return high


def _read(path, limit):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise ValueError(f"{os.path.basename(path)} is not a regular file of at most {limit} bytes")
        return f.read(limit + 1)


def _size(entry):
    """The bytes a header entry declares (its file may hold no more); ValueError for a malformed entry."""
    tensors = entry.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError("malformed output header")
    ends = [t.get("offset", -1) + t.get("nbytes", -1) if isinstance(t, dict) and isinstance(t.get("offset"), int)
            and isinstance(t.get("nbytes"), int) else -1 for t in tensors]
    if any(end < 0 for end in ends) or max(ends, default=0) > MAX_FILE_BYTES:
        raise ValueError("malformed output header")
    return max(ends, default=0)


def _device(data):
    if isinstance(data, torch.Tensor):
        return data.device
    items = data.values() if isinstance(data, dict) else data if isinstance(data, (tuple, list)) else ()
    for item in items:
        found = _device(item)
        if found is not None:
            return found
    return None


def load(entry, blob, device):
    """The output a header entry and its bytes describe, on `device`; ValueError for anything malformed."""
    structure, tensors = entry.get("structure"), entry.get("tensors")
    if structure not in ("tensor", "tuple", "list") or not isinstance(tensors, list) or not tensors \
            or (structure == "tensor" and len(tensors) != 1):
        raise ValueError("malformed output header")
    loaded = []
    for t in tensors:
        dtype, shape, offset, nbytes = t.get("dtype"), t.get("shape"), t.get("offset"), t.get("nbytes")
        if dtype not in DTYPES or not hasattr(torch, dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape) \
                or not all(isinstance(n, int) and n >= 0 for n in (offset, nbytes)):
            raise ValueError("malformed output header")
        kind = getattr(torch, dtype)
        if nbytes != math.prod(shape) * torch.empty((), dtype=kind).element_size() or offset + nbytes > len(blob):
            raise ValueError("output bytes do not match their header")
        chunk = bytearray(blob[offset:offset + nbytes])
        flat = torch.frombuffer(chunk, dtype=kind) if nbytes else torch.empty(0, dtype=kind)
        loaded.append(flat.reshape(shape).to(device))
    return loaded[0] if structure == "tensor" else tuple(loaded) if structure == "tuple" else loaded


def judge_case(index, case, repeats, out, tolerance):
    found = {"index": index, "accepted": True, "passed": True, "margin": None, "deterministic": None,
             "distinct": 0, "message": ""}
    try:
        data = tolerance.module.generate_input(**case)
    except Exception as e:
        return {**found, "accepted": False, "passed": None, "message": f"generate_input refused it: {e}"[:300]}
    try:
        header = json.loads(_read(os.path.join(out, f"{index}.json"), 1 << 20))
    except (OSError, ValueError) as e:
        return {**found, "passed": False, "message": f"no outputs: {e}"[:300]}
    calls = header.get("repeats") if isinstance(header, dict) else None
    if not isinstance(calls, list) or len(calls) != repeats:
        why = header.get("rejected") if isinstance(header, dict) else None
        return {**found, "passed": False, "message": f"no outputs: {why or 'malformed header'}"[:300]}
    device = _device(data) or torch.device("cpu")
    seen = {}
    margins = []
    for r, entry in enumerate(calls):
        try:
            if not isinstance(entry, dict) or "error" in entry:
                raise ValueError(f"custom_kernel failed: {entry.get('error') if isinstance(entry, dict) else entry}")
            blob = _read(os.path.join(out, f"{index}-{r}.bin"), _size(entry))
            digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode() + blob).hexdigest()
            if digest in seen:
                continue
            output = load(entry, blob, device)
            seen[digest] = r
        except (OSError, ValueError) as e:
            found.update(passed=False, message=found["message"] or str(e)[:500])
            continue
        found_margin = margin(data, output, tolerance)
        # A margin of at most 1 is a pass at the task's own tolerance (the bisection found a scale <= 1 that
        # passes): one check of a large output fewer.
        ok, message = (True, "") if found_margin is not None and found_margin <= 1.0 else check(
            data, output, tolerance, 1.0)
        if not ok:
            found.update(passed=False, message=found["message"] or message[:500])
        margins.append(found_margin)
    found["distinct"] = len(seen)
    found["deterministic"] = len(seen) == 1 if seen else None
    known = [m for m in margins if m is not None]
    found["margin"] = max(known) if known and len(known) == len(margins) else None
    return found


def main(plan_path, out):
    with open(plan_path) as f:
        plan = json.load(f)
    torch.manual_seed(0)
    import reference  # the task's, beside this file; no submission file is in this folder

    tolerance = Tolerance(reference)
    results = [judge_case(i, case, plan["repeats"], out, tolerance) for i, case in enumerate(plan["cases"])]
    document = json.dumps({"tolerance_functions": tolerance.patched, "cases": results}).encode()
    fd = int(os.environ["POPKIT_RISK_FD"])
    while document:
        document = document[os.write(fd, document):]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
