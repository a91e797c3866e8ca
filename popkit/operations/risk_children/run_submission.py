"""popkit risk, the submission's side: every planned case's outputs, written as raw bytes and a JSON header.

Runs in the sandbox beside the task's files (standard library and torch only; it imports the task's reference for
`generate_input` and the submission for `custom_kernel`). Usage: run_submission.py PLAN_JSON OUT_FOLDER. For case
i: `OUT/i.json` ({"rejected": why} when generate_input refused the case, else {"repeats": [...]}, one entry per
call: {"error": text} or {"structure": "tensor"|"tuple"|"list", "tensors": [{dtype, shape, offset, nbytes}]})
and `OUT/i-r.bin`, the tensors' bytes of call r one after another. Nothing is judged here: popkit's judge, a process
that never imports the submission, reads these files (no pickle: bytes and JSON only).
"""

import ctypes
import json
import os
import sys

import torch


def _clone(data):
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, (tuple, list)):
        return type(data)(_clone(x) for x in data)
    if isinstance(data, dict):
        return {k: _clone(v) for k, v in data.items()}
    return data


def _write(output, path):
    if isinstance(output, torch.Tensor):
        structure, tensors = "tensor", [output]
    elif isinstance(output, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in output):
        structure, tensors = type(output).__name__, list(output)
    else:
        return {"error": f"custom_kernel returned {type(output).__name__}: popkit risk reads a tensor, or a tuple "
                         "or list of tensors"}
    entries, offset = [], 0
    with open(path, "wb") as f:
        for t in tensors:
            flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            # One copy of the bytes at C speed (bytes() of a storage walks it element by element in Python:
            # 30 s for 8 MB, minutes for a benchmark shape's output).
            data = ctypes.string_at(flat.data_ptr(), flat.numel()) if flat.numel() else b""
            f.write(data)
            entries.append({"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                            "offset": offset, "nbytes": len(data)})
            offset += len(data)
    return {"structure": structure, "tensors": entries}


def main(plan_path, out):
    with open(plan_path) as f:
        plan = json.load(f)
    from reference import generate_input
    from submission import custom_kernel

    os.makedirs(out, exist_ok=True)
    for i, case in enumerate(plan["cases"]):
        header = {"repeats": []}
        try:
            data = generate_input(**case)
        except Exception as e:  # the judge asks the generator itself; this only saves the calls
            header = {"rejected": f"{type(e).__name__}: {e}"[:300]}
            data = None
        for r in range(plan["repeats"] if data is not None else 0):
            try:
                output = custom_kernel(_clone(data))
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                entry = _write(output, os.path.join(out, f"{i}-{r}.bin"))
            except Exception as e:
                entry = {"error": f"{type(e).__name__}: {e}"[:500]}
            header["repeats"].append(entry)
        with open(os.path.join(out, f"{i}.json"), "w") as f:
            json.dump(header, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
