"""popkit.lint: every rule has a file that triggers it and one that does not."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

from popkit.check import lint
from popkit.check.lint import LintReport, check_bytes
from popkit.model.diagnostics import Diagnostic, finding

OK_BODY = "import torch\n\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"


def _check(source: str, name: str = "sub.py", **kwargs) -> LintReport:
    kwargs.setdefault("guard", False)
    return check_bytes(textwrap.dedent(source).encode(), name, **kwargs)


def _rules(report: LintReport, severity: str | None = None) -> set[str]:
    return {f.rule for f in report.findings if severity is None or f.severity == severity}


def test_clean_submission_has_no_findings():
    report = _check("#!POPCORN leaderboard vectoradd\n#!POPCORN gpu H100\n" + OK_BODY)
    assert report.findings == ()
    assert report.ok
    assert (report.leaderboard, report.gpu) == ("vectoradd", "H100")


# ----------------------------------------------------------------------------- server refusals


def test_size_limit():
    big = (OK_BODY + "#" + "x" * lint.MAX_BYTES).encode()
    assert "size" in _rules(check_bytes(big, "sub.py", guard=False), "error")
    exact = OK_BODY.encode() + b"#" * (lint.MAX_BYTES - len(OK_BODY))
    assert len(exact) == lint.MAX_BYTES
    assert "size" not in _rules(check_bytes(exact, "sub.py", guard=False))


def test_empty_file():
    assert "empty" in _rules(check_bytes(b" \n\n", "sub.py", guard=False), "error")
    assert "empty" not in _rules(_check(OK_BODY))


def test_a_utf8_bom_runs_but_is_warned_about_for_the_servers_directive_block():
    report = check_bytes(b"\xef\xbb\xbf" + OK_BODY.encode(), "sub.py", guard=False)
    assert report.ok and "syntax" not in _rules(report)
    (bom,) = [f for f in report.findings if f.rule == "bom"]
    assert (bom.severity, bom.line, bom.column) == ("warning", 1, 1)
    assert bom.message == ("the file starts with a UTF-8 byte-order mark (BOM): Python skips it, but the server"
                           " and popcorn-cli read it as part of line 1, so no `#!POPCORN` directive there counts")


def test_not_utf8_names_line_and_column():
    report = check_bytes(OK_BODY.encode() + b"# caf\xe9\n", "sub.py", guard=False)
    (finding,) = [f for f in report.findings if f.rule == "utf8"]
    assert finding.severity == "error"
    assert (finding.line, finding.column) == (7, 6)
    assert "not UTF-8" in finding.message
    assert "utf8" not in _rules(_check(OK_BODY + "# café\n"))


@pytest.mark.parametrize("name", ["sub.txt", "sub", "sub.PY.bak"])
def test_extension_refused(name):
    assert "extension" in _rules(_check(OK_BODY, name), "error")


@pytest.mark.parametrize("name", ["sub.py", "kernel.cu", "kernel.cuh", "kernel.cpp"])
def test_extension_accepted(name):
    assert "extension" not in _rules(_check(OK_BODY, name))


def test_stream_anywhere_with_line_and_column():
    src = OK_BODY + "# no side STREAMs here\nx = 'upstream'\n"
    hits = [(f.line, f.column) for f in _check(src).findings if f.rule == "stream"]
    assert hits == [(7, 11), (8, 8)]
    assert all(f.severity == "error" for f in _check(src).findings if f.rule == "stream")


def test_stream_in_cuda_file():
    assert "stream" in _rules(_check("__global__ void k(cudaStream_t s) {}\n", "k.cu"))
    assert "stream" not in _rules(_check("__global__ void k() {}\n", "k.cu"))


@pytest.mark.parametrize("header, message", [
    ("#!POPCORN leaderboard vectoradd\n#!POPCORN leaderboard grayscale\n", "repeated"),
    ("#!POPCORN gpu\n", "has no value"),
    ("#!POPCORN runner modal\n", "unknown directive"),
])
def test_directive_block_errors(header, message):
    report = _check(header + OK_BODY)
    found = [f for f in report.findings if f.rule == "directive"]
    assert found and found[0].severity == "error" and message in found[0].message
    assert found[0].line is not None


def test_directive_after_blank_line_is_outside_the_block():
    report = _check("import torch\n\n#!POPCORN leaderboard vectoradd\n" + OK_BODY)
    (finding,) = [f for f in report.findings if f.rule == "directive-outside-block"]
    assert finding.severity == "warning" and finding.line == 3
    assert report.leaderboard == "vectoradd"  # popcorn-cli still reads it
    assert "directive-outside-block" not in _rules(_check("#!POPCORN leaderboard vectoradd\n" + OK_BODY))


def test_directive_conflict_between_server_and_client_reading():
    src = "#!POPCORN gpu H100\n" + OK_BODY + "#!POPCORN gpu A100\n"
    report = _check(src)
    assert "directive-conflict" in _rules(report, "error")
    assert report.gpu == "A100"  # popcorn-cli: the last wins


def test_uppercase_leaderboard_in_directive():
    report = _check("#!POPCORN leaderboard VectorAdd\n" + OK_BODY)
    (finding,) = [f for f in report.findings if f.rule == "leaderboard-case"]
    assert finding.severity == "error" and finding.line == 1
    assert "lowercases" in finding.message and "`vectoradd`" in finding.hint
    assert report.leaderboard == "vectoradd"


def test_uppercase_leaderboard_flag():
    assert "leaderboard-case" in _rules(_check(OK_BODY, leaderboard="VectorAdd"), "error")
    assert "leaderboard-case" not in _rules(_check(OK_BODY, leaderboard="vectoradd"))


def test_leaderboard_flag_must_match_directive():
    report = _check("#!POPCORN leaderboard grayscale\n" + OK_BODY, leaderboard="vectoradd")
    assert "leaderboard-mismatch" in _rules(report, "error")
    assert report.leaderboard == "vectoradd"  # the flag overrides, as in popcorn-cli
    same = _check("#!POPCORN leaderboard vectoradd\n" + OK_BODY, leaderboard="vectoradd")
    assert "leaderboard-mismatch" not in _rules(same)


def test_gpu_not_offered():
    report = _check(OK_BODY, leaderboard="vectoradd", gpu="T5", offered_gpus=("A100", "H100"))
    (finding,) = [f for f in report.findings if f.rule == "gpu-not-offered"]
    assert finding.severity == "error" and "A100, H100" in finding.hint
    near = _check(OK_BODY, leaderboard="vectoradd", gpu="h100", offered_gpus=("A100", "H100"))
    assert "did you mean `H100`" in [f for f in near.findings if f.rule == "gpu-not-offered"][0].hint
    assert "gpu-not-offered" not in _rules(_check(OK_BODY, gpu="H100", offered_gpus=("A100", "H100")))
    assert "gpu-not-offered" not in _rules(_check(OK_BODY, gpu="T5", offered_gpus=None))  # unknown list


def test_gpu_list_from_problem_set(tmp_path):
    task = tmp_path / "mytask"
    task.mkdir()
    (task / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n  - {name: eval.py, source: eval.py}\n"
        "lang: py\ndescription: x\nconfig: {main: eval.py}\n")
    (task / "eval.py").write_text("")
    (tmp_path / "problems.yaml").write_text(
        "name: set\nproblems:\n  - {directory: mytask, name: mine, gpus: [L4, T4]}\n")
    assert lint.offered_gpus_for("mine", [tmp_path]) == ("L4", "T4")
    assert lint.offered_gpus_for("nonesuch", [tmp_path]) is None
    report = check_bytes(OK_BODY.encode(), "sub.py", leaderboard="mine", gpu="H100", resolve_gpus=True,
                         roots=[tmp_path], guard=False)
    assert report.offered_gpus == ("L4", "T4")
    assert "gpu-not-offered" in _rules(report)


def test_several_gpus_in_directive():
    report = _check("#!POPCORN gpu H100 A100\n" + OK_BODY)
    assert "gpu-several" in _rules(report, "warning") and report.gpu == "H100"
    assert "gpu-several" not in _rules(_check("#!POPCORN gpu H100 A100\n" + OK_BODY, gpu="A100"))


def test_mode_names():
    assert "mode" in _rules(_check(OK_BODY, mode="ranked"), "error")
    for mode in ("test", "benchmark", "leaderboard", "profile"):
        assert "mode" not in _rules(_check(OK_BODY, mode=mode))


# ------------------------------------------------------------------------------ reward hacks

HACKS = [
    ("timer-patch", "torch.cuda.synchronize = lambda: None\n", "torch.cuda.synchronize()\n"),
    ("timer-patch", "torch.cuda.Event.elapsed_time = lambda s, e: 0.001\n",
     "e = torch.cuda.Event(enable_timing=True)\n"),
    ("timer-patch", "import time\ntime.perf_counter = lambda: 0.0\n", "import time\nt = time.perf_counter()\n"),
    ("timer-patch", "from torch.cuda import Event\nEvent.record = lambda self, s=None: None\n",
     "from torch.cuda import Event\nEvent(enable_timing=True).record()\n"),
    ("timer-patch", "setattr(torch.cuda, 'synchronize', lambda: None)\n", "getattr(torch.cuda, 'synchronize')()\n"),
    ("timer-patch", "from unittest import mock\nmock.patch('time.perf_counter', lambda: 0).start()\n",
     "from unittest import mock\n"),
    ("harness-import", "import eval\n", "import evaluate_helpers\n"),
    ("harness-import", "from reference import check_implementation\n", "from reference import ref_kernel\n"),
    ("harness-patch", "import reference\nreference.check_implementation = lambda d, o: (True, '')\n",
     "import reference\n"),
    ("harness-patch", "import utils\nutils.compare = lambda *a, **k: (True, '')\n", "import utils\n"),
    ("harness-patch", "import builtins\nbuiltins.print = lambda *a: None\n", "import builtins\n"),
    ("result-fd", "import os\nx = os.environ.get('POPCORN_FD')\n", "import os\nx = os.environ.get('HOME')\n"),
    ("result-fd", "import os\nos.write(3, b'check: pass\\n')\n", "import os\nos.getpid()\n"),
    ("result-fd", "f = open(3, 'w')\n", "f = open('log.txt', 'w')\n"),
    ("sys-modules", "import sys\nsys.modules['time'] = None\n", "import sys\nv = sys.version\n"),
    ("sys-modules", "import sys\nsys.modules.pop('torch')\n", "import sys\n"),
    ("frame-walk", "import sys\nf = sys._getframe(1)\n", "import sys\n"),
    ("frame-walk", "import inspect\nf = inspect.currentframe().f_back\n", "import inspect\n"),
    ("frame-walk", "import gc\nobjs = gc.get_objects()\n", "import gc\ngc.collect()\n"),
    ("runtime-install", "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', 'install', 'triton'])\n",
     "import subprocess\nsubprocess.run(['nvidia-smi'])\n"),
    ("runtime-install", "import os\nos.system('pip install cupy')\n", "import os\nos.system('nvcc --version')\n"),
    ("runtime-install", "import pip\n", "import pipes_helper\n"),
]


@pytest.mark.parametrize("rule, bad, good", HACKS)
def test_hack_rule_is_an_error(rule, bad, good):
    bad_report = _check("import torch\n" + bad + OK_BODY)
    found = [f for f in bad_report.findings if f.rule == rule]
    assert found and found[0].severity == "error", bad_report.findings
    assert found[0].line is not None and found[0].message and found[0].hint
    assert not bad_report.ok
    assert rule not in _rules(_check("import torch\n" + good + OK_BODY))


def test_popcorn_fd_in_a_docstring_or_comment_is_prose():
    src = '"""Never touches POPCORN_FD."""\n# nor POPCORN_FD here\n' + OK_BODY
    assert "result-fd" not in _rules(_check(src))
    assert "result-fd" in _rules(_check("// reads POPCORN_FD\n__global__ void k() {}\n", "k.cu"), "error")


@pytest.mark.parametrize("rule, bad, good", [
    ("mode-branch", "import sys\nMODE = sys.argv[1]\n", "import sys\nV = sys.version_info\n"),
    ("lazy-output", "class Lazy(torch.Tensor):\n    pass\n", "class Config:\n    pass\n"),
    ("lazy-output", "class Hook:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):\n"
                    "        return f(*a)\n", "class Hook:\n    def __call__(self):\n        return 1\n"),
])
def test_warning_rules(rule, bad, good):
    report = _check("import torch\n" + bad + OK_BODY)
    found = [f for f in report.findings if f.rule == rule]
    assert found and found[0].severity == "warning" and found[0].line is not None
    assert report.ok
    assert rule not in _rules(_check("import torch\n" + good + OK_BODY))


REPLAY_BY_SHAPE = """
_cache = {}
def custom_kernel(data):
    a, b = data
    key = (tuple(a.shape), a.dtype)
    if key not in _cache:
        _cache[key] = a + b
    return _cache[key]
"""

KERNEL_TABLE = """
_kernels = {}
def custom_kernel(data):
    a, b = data
    fn = _kernels.get(a.dtype)
    out = fn(a, b)
    return out
"""


def test_mode_branch_inside_custom_kernel_is_an_error():
    src = ("import sys\n\ndef custom_kernel(data):\n    if sys.argv[1] == 'test':\n        return data\n"
           "    return data\n")
    (finding,) = [f for f in _check(src).findings if f.rule == "mode-branch"]
    assert finding.severity == "error" and finding.line == 4


def test_returning_a_stored_output_warns():
    (finding,) = [f for f in _check(REPLAY_BY_SHAPE).findings if f.rule == "output-replay"]
    assert finding.severity == "warning" and finding.line == 8
    assert "output-replay" not in _rules(_check(KERNEL_TABLE))
    # a data_ptr-keyed replay is the error rule alone, not also this warning
    assert "output-replay" not in _rules(_check(CACHE_REPLAY))


def test_reference_import_is_a_warning():
    report = _check("from reference import ref_kernel\n" + OK_BODY)
    assert _rules(report) == {"reference-import"} and report.ok
    assert "reference-import" not in _rules(_check("from task import input_t\n" + OK_BODY))


def test_exec_of_built_string_warns():
    report = _check("src = 'x' + ' = 1'\nexec(src)\n" + OK_BODY)
    (finding,) = [f for f in report.findings if f.rule == "exec-built"]
    assert finding.severity == "warning" and finding.line == 2
    assert report.ok
    assert "exec-built" not in _rules(_check("exec('x = 1')\n" + OK_BODY))
    assert "exec-built" not in _rules(_check("import re\np = re.compile(r'\\d+')\nm = torch.compile\n" + OK_BODY))


# ------------------------------------------------------------------ names built at run time

# Each builds a word the server bans by name, or a timer / harness name, from pieces no rule reads as text.
S, TR = "Str", "eam"
DYNAMIC_BAD = [
    f"Side = getattr(torch.cuda, '{S}' + '{TR}')\n",
    f"Side = getattr(torch.cuda, ''.join(['{S}', '{TR}']))\n",
    "import base64\nSide = getattr(torch.cuda, base64.b64decode('U3RyZWFt').decode())\n",
    f"P = '{S}'\nSide = getattr(torch.cuda, f'{{P}}{TR}')\n",
    f"Side = getattr(torch.cuda, '{{}}{TR}'.format('{S}'))\n",
    f"Side = getattr(torch.cuda, '%s{TR}' % '{S}')\n",
    "Side = getattr(torch.cuda, 'maertS'[::-1])\n",
    "import codecs\nSide = getattr(torch.cuda, codecs.decode('Fgernz', 'rot13'))\n",
    "Side = getattr(torch.cuda, bytes([83, 116, 114, 101, 97, 109]).decode())\n",
    "Side = getattr(torch.cuda, chr(83) + 'tr' + chr(101) + 'am')\n",
    f"NAME = '{S}'.lower() + '{TR}'\nSide = torch.cuda.__dict__[NAME]\n",
    f"Side = vars(torch.cuda)['{S}' + '{TR}']\n",
    f"import operator\nSide = operator.attrgetter('cuda.' + '{S}' + '{TR}')(torch)\n",
    f"import importlib\ncuda = importlib.import_module('torch.cuda.' + '{S.lower()}' + '{TR}s')\n",
    "sync = getattr(torch.cuda, 'synchro' + 'nize')\n",
    "import importlib\nh = importlib.import_module('ev' + 'al')\n",
]


@pytest.mark.parametrize("bad", DYNAMIC_BAD, ids=range(len(DYNAMIC_BAD)))
def test_an_attribute_or_module_name_built_from_pieces_is_an_error(bad):
    report = _check("import torch\n" + bad + OK_BODY)
    found = [f for f in report.findings if f.rule == "dynamic-name"]
    assert found and found[0].severity == "error", report.findings
    assert found[0].line == bad.count("\n") + 1 and "built at run time" in found[0].message
    assert "stream" not in bad.lower()  # the server's word ban would not see any of them


def test_an_attribute_name_built_from_unknown_pieces_warns():
    src = "import torch\ndef get(prefix):\n    return getattr(torch.cuda, prefix + 'eam')\n" + OK_BODY
    (finding,) = [f for f in _check(src).findings if f.rule == "dynamic-name"]
    assert finding.severity == "warning" and finding.line == 3


@pytest.mark.parametrize("good", [
    "dt = getattr(torch, 'float16')\n",
    "dt = getattr(torch, 'float' + '16')\n",  # built, but nothing it should not reach
    "def dtype(name):\n    return getattr(torch, name)\n",
    "x = hasattr(torch, 'compile')\n",
    "import importlib\nm = importlib.import_module('torch.nn')\n",
    "CFG = {'a': 1}\nv = CFG['a' + 'b'] if False else 0\n",
    "ops = {n: getattr(torch, n) for n in ('add', 'mul')}\n",
])
def test_ordinary_dynamic_access_is_no_finding(good):
    assert "dynamic-name" not in _rules(_check("import torch\n" + good + OK_BODY))


CACHE_REPLAY = """
import torch
_cache = {}
def custom_kernel(data):
    a, b = data
    key = (a.data_ptr(), b.data_ptr())
    if key in _cache:
        return _cache[key]
    out = a + b
    _cache[key] = out
    return out
"""

CACHE_BY_ID = """
import torch
_seen = {}
def custom_kernel(data):
    hit = _seen.get(id(data))
    if hit is not None:
        return hit
    out = data[0] + data[1]
    _seen[id(data)] = out
    return out
"""

CACHE_BY_SHAPE = """
import torch
_kernels = {}
def custom_kernel(data):
    a, b = data
    fn = _kernels.setdefault(a.shape, torch.add)
    return fn(a, b)
"""

DESCRIPTOR_CACHE = """
import torch
_desc = {}
def custom_kernel(data):
    a, b = data
    _desc[a.data_ptr()] = a.shape
    return a + b
"""


def test_output_cache_keyed_on_data_ptr_is_an_error():
    (finding,) = [f for f in _check(CACHE_REPLAY).findings if f.rule == "output-cache"]
    assert finding.severity == "error" and finding.line == 8  # the `return _cache[key]`


def test_output_cache_keyed_on_id_is_an_error():
    (finding,) = [f for f in _check(CACHE_BY_ID).findings if f.rule == "output-cache"]
    assert finding.severity == "error" and finding.line == 7


def test_pointer_keyed_cache_that_is_not_returned_warns():
    (finding,) = [f for f in _check(DESCRIPTOR_CACHE).findings if f.rule == "output-cache"]
    assert finding.severity == "warning" and finding.line == 6


def test_cache_keyed_on_shape_is_fine():
    assert "output-cache" not in _rules(_check(CACHE_BY_SHAPE))


def test_memoized_custom_kernel_is_an_error():
    src = "import functools\n@functools.lru_cache(maxsize=None)\n" + OK_BODY.replace("import torch\n\n\n", "")
    assert "output-cache" in _rules(_check(src), "error")
    helper = "import functools\n@functools.lru_cache\ndef _build(n):\n    return n\n" + OK_BODY
    assert "output-cache" not in _rules(_check(helper))


def test_thread_in_custom_kernel_is_an_error_and_at_import_a_warning():
    inside = "import threading\n\ndef custom_kernel(data):\n    threading.Thread(target=print).start()\n" \
             "    return data[0]\n"
    assert [(f.severity, f.line) for f in _check(inside).findings if f.rule == "thread-start"] == [("error", 4)]
    at_import = "from concurrent.futures import ThreadPoolExecutor\npool = ThreadPoolExecutor(4)\n" + OK_BODY
    assert [(f.severity, f.line) for f in _check(at_import).findings if f.rule == "thread-start"] == [("warning", 2)]
    helper = "import threading\n\ndef _compile_all():\n    threading.Thread(target=print).start()\n" + OK_BODY
    main_guard = OK_BODY + "\nif __name__ == '__main__':\n    import threading\n    threading.Thread(target=print)\n"
    assert "thread-start" not in _rules(_check(helper))
    assert "thread-start" not in _rules(_check(main_guard))


def test_comments_and_kernel_strings_do_not_trigger_ast_rules():
    src = OK_BODY + '# we never do torch.cuda.synchronize = None\nSRC = "os.write(3, x); exec(code)"\n'
    assert _check(src).findings == ()


def test_syntax_error_and_missing_entry_point():
    broken = _check("def custom_kernel(data:\n    return 1\n")
    (finding,) = [f for f in broken.findings if f.rule == "syntax"]
    assert finding.severity == "error" and finding.line == 1
    assert "no-custom-kernel" in _rules(_check("import torch\n\ndef kernel(data):\n    return data\n"), "error")
    assert "no-custom-kernel" not in _rules(_check("from mykernels import custom_kernel\n"))
    assert "no-custom-kernel" not in _rules(_check("try:\n    from fast import custom_kernel\n"
                                                   "except ImportError:\n    custom_kernel = None\n"))


def test_cuda_files_get_only_textual_rules():
    report = _check("// torch.cuda.synchronize = 0\n__global__ void k() {}\n", "k.cu")
    assert report.findings == ()


def test_findings_sorted_errors_first():
    report = _check("exec(''.join(['x=1']))\n" + OK_BODY + "# stream\n")
    assert [f.severity for f in report.findings] == ["error", "warning"]


# ------------------------------------------------------------------------------- KernelGuard


def _fake_guard(monkeypatch, result):
    module = types.ModuleType("kernelguard")
    module.analyze_code = lambda code, metadata=None, compute_structural_hash=True: result
    monkeypatch.setitem(sys.modules, "kernelguard", module)


def test_kernelguard_hacked_verdict_is_an_error(monkeypatch):
    _fake_guard(monkeypatch, {"classification": "hacked", "should_filter": True, "matched_patterns": [
        {"pattern": "TIMER_MONKEYPATCH", "severity": "critical", "evidence": "torch.cuda.synchronize patched"}]})
    report = check_bytes(OK_BODY.encode(), "sub.py")
    assert report.guard.classification == "hacked" and report.guard.via == "module"
    assert report.guard.patterns[0].pattern == "TIMER_MONKEYPATCH"
    (finding,) = [f for f in report.findings if f.rule == "kernelguard"]
    assert finding.severity == "error" and "TIMER_MONKEYPATCH" in finding.message


def test_kernelguard_suspicious_warns_and_valid_is_silent(monkeypatch):
    _fake_guard(monkeypatch, {"classification": "suspicious", "should_filter": False, "matched_patterns": []})
    assert _rules(check_bytes(OK_BODY.encode(), "sub.py"), "warning") == {"kernelguard"}
    _fake_guard(monkeypatch, {"classification": "valid", "should_filter": False, "matched_patterns": []})
    report = check_bytes(OK_BODY.encode(), "sub.py")
    assert report.guard.classification == "valid" and report.findings == ()


def test_kernelguard_crash_is_reported_not_raised(monkeypatch):
    module = types.ModuleType("kernelguard")
    module.analyze_code = lambda *a, **k: 1 / 0
    monkeypatch.setitem(sys.modules, "kernelguard", module)
    report = check_bytes(OK_BODY.encode(), "sub.py")
    assert report.guard.error.startswith("ZeroDivisionError") and report.findings == ()


def test_kernelguard_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernelguard", None)  # makes `import kernelguard` fail
    monkeypatch.setenv("PATH", "")
    assert check_bytes(OK_BODY.encode(), "sub.py").guard is None


def test_kernelguard_cli_fallback(monkeypatch, tmp_path):
    exe = tmp_path / "kernelguard"
    exe.write_text("#!/bin/sh\ncat > /dev/null\n"
                   "echo '{\"classification\": \"hacked\", \"should_filter\": true, \"matched_patterns\": "
                   "[{\"pattern\": \"POINTER_REPLAY\", \"severity\": \"critical\", \"evidence\": \"e\"}]}'\n")
    exe.chmod(0o755)
    monkeypatch.setitem(sys.modules, "kernelguard", None)
    monkeypatch.setenv("PATH", str(tmp_path))
    verdict = lint.run_kernelguard(OK_BODY)
    assert verdict.via == "cli" and verdict.should_filter and verdict.patterns[0].pattern == "POINTER_REPLAY"


# ------------------------------------------------------------------------------ serialization


def test_report_round_trip(monkeypatch):
    _fake_guard(monkeypatch, {"classification": "hacked", "should_filter": True, "matched_patterns": [
        {"pattern": "P", "severity": "high", "evidence": "e"}]})
    report = check_bytes(("#!POPCORN leaderboard VectorAdd\n" + OK_BODY + "# stream\n").encode(), "sub.py",
                         gpu="T5", offered_gpus=("H100",), mode="test")
    assert report.findings and report.guard is not None
    data = report.to_json()
    assert data["schema"] == "popkit/check/1" and data["ok"] is False
    assert LintReport.from_json(data) == report
    plain = _check(OK_BODY)
    assert LintReport.from_json(plain.to_json()) == plain


def test_finding_round_trip():
    found = finding("stream", "error", 3, 7, "m", "h")
    assert (found.rule, found.tool, found.location) == ("stream", "check", ":3:7")
    assert Diagnostic.from_json(found.to_json()) == found


def test_check_file_reads_bytes_once(tmp_path):
    path = tmp_path / "sub.py"
    path.write_text(OK_BODY)
    report = lint.check_file(path, guard=False)
    assert report.path == str(path) and report.size_bytes == len(OK_BODY)
    with pytest.raises(Exception) as info:
        lint.check_file(tmp_path / "missing.py", guard=False)
    assert "no such file" in str(info.value)


# --------------------------------------------------------------------- the bundled submissions

SUBMISSIONS = Path(__file__).resolve().parent.parent / "submissions"
CHEAT_RULES = {  # cheats a static check can see, and the rule that must name them
    "background_thread.py": "thread-start", "check_patch.py": "harness-patch", "pipe_write.py": "result-fd",
    "replay_data_ptr.py": "output-cache", "synchronize_patch.py": "timer-patch", "timer_patch.py": "timer-patch",
    "replay_cache.py": "output-replay", "batch_and_skip.py": "output-replay", "mode_branching.py": "mode-branch",
    "lazy_output.py": "lazy-output", "side_stream.py": "dynamic-name", "side_stream_share.py": "dynamic-name",
}
EXAMPLES = sorted(p for p in SUBMISSIONS.glob("*/*.py") if p.parent.name not in ("cheats", "wrong"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_submission_passes(path):
    report = lint.check_file(path, guard=False)
    assert report.ok, [(f.rule, f.line, f.message) for f in report.errors]


@pytest.mark.parametrize("name, rule", sorted(CHEAT_RULES.items()))
def test_cheat_examples_flag_the_right_rule(name, rule):
    path = SUBMISSIONS / "cheats" / name
    if not path.is_file():
        pytest.skip(f"{path} not in this checkout")
    assert rule in _rules(lint.check_file(path, guard=False))


# ---------------------------------------------------------------------------------- the command

from typer.testing import CliRunner  # noqa: E402

from popkit.cli import app  # noqa: E402

CLI_ENV = {"POPKIT_WIDTH": "200", "NO_COLOR": "1"}


def test_check_command_ok(tmp_path):
    path = tmp_path / "v7.py"
    path.write_text("#!POPCORN leaderboard vectoradd\n" + OK_BODY)
    result = CliRunner().invoke(app, ["check", str(path), "--no-guard"], env=CLI_ENV)
    assert result.exit_code == 0, result.output
    assert f"popkit check {path} · leaderboard vectoradd" in result.output
    assert "OK: no errors" in result.output
    assert "REFUSED" not in result.output


def test_check_command_errors_exit_8_with_line_and_column(tmp_path):
    path = tmp_path / "v7.py"
    path.write_text(OK_BODY + "torch.cuda.synchronize = lambda: None\ns = torch.cuda.current_stream()\n")
    result = CliRunner().invoke(app, ["check", str(path), "--no-guard", "--gpu", "H100"], env=CLI_ENV)
    assert result.exit_code == 8, result.output
    assert f"{path}:7:1: error [timer-patch] replaces `torch.cuda.synchronize`" in result.output
    assert f"{path}:8:24: error [stream]" in result.output
    assert "REFUSED: 2 errors, 0 warnings" in result.output


def test_check_command_warnings_exit_0(tmp_path):
    path = tmp_path / "v7.py"
    path.write_text("import sys\nMODE = sys.argv[1]\n" + OK_BODY)
    result = CliRunner().invoke(app, ["check", str(path), "--no-guard"], env=CLI_ENV)
    assert result.exit_code == 0, result.output
    assert f"{path}:2:8: warning [mode-branch]" in result.output
    assert "OK: no errors, 1 warning" in result.output


def test_check_command_json(tmp_path):
    path = tmp_path / "v7.cu"
    path.write_text("// stream\n")
    result = CliRunner().invoke(app, ["check", str(path), "--json", "--mode", "ranked"], env=CLI_ENV)
    assert result.exit_code == 8, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/check/1" and doc["ok"] is False
    assert {f["rule"] for f in doc["findings"]} == {"stream", "mode"}


def test_check_command_missing_file(tmp_path):
    result = CliRunner().invoke(app, ["check", str(tmp_path / "nope.py")], env=CLI_ENV)
    assert result.exit_code == 4 and "no such file" in result.output
