"""Lint bypasses (tests/adversarial/lint/): each hid a reward hack from `popkit check` and got no finding.

Each file's class is closed, not just the file: the parametrized cases after the files are other members
of the same classes. A name popkit cannot fold is a warning, never silence; a crafted file never crashes
or stalls the check; and no honest file (the examples, every rendered template) gets any finding.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from popkit.author import render
from popkit.check import lint
from popkit.resources import data_dir

ATTACKS = Path(__file__).parent / "adversarial" / "lint"
ROOT = Path(__file__).resolve().parent.parent
OK = "\n\ndef custom_kernel(data):\n    return data\n"

# file -> (rule, severity, line) of every finding it must get, and nothing else
EXPECTED = {
    "rot13_getdecoder.py": {("dynamic-name", "error", 7)},
    "rot13_rebound.py": {("dynamic-name", "error", 9)},
    "rot13_alias.py": {("dynamic-name", "error", 10), ("dynamic-name", "error", 11), ("dynamic-name", "error", 13)},
    "rot13_wrapper.py": {("dynamic-name", "error", 16)},
    "rot13_translate.py": {("dynamic-name", "error", 6)},
    "chr_loop.py": {("dynamic-name", "error", 7)},
    "chr_append_loop.py": {("dynamic-name", "error", 8)},
    "chr_map.py": {("dynamic-name", "error", 8), ("dynamic-name", "error", 9)},
    "compile_function.py": {("timer-patch", "error", 5), ("code-object", "warning", 6)},
    "pickle_embedded.py": {("unpickle", "error", 6)},
    "importlib_task_file.py": {("load-by-path", "error", 5)},
    "plant_module.py": {("module-write", "error", 8), ("module-write", "error", 9), ("module-write", "error", 11)},
}


def _found(source: str) -> set[tuple[str, str]]:
    report = lint.check_bytes(textwrap.dedent(source).encode(), "sub.py", guard=False)
    return {(f.rule, f.severity) for f in report.findings}


def test_every_attack_file_is_listed_and_says_its_class():
    assert sorted(p.name for p in ATTACKS.glob("*.py")) == sorted(EXPECTED)
    for path in ATTACKS.glob("*.py"):
        doc = path.read_text().split('"""')[1]
        assert doc.startswith("Class: "), path.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_attack_file_gets_its_findings(name):
    report = lint.check_file(ATTACKS / name, guard=False)
    assert {(f.rule, f.severity, f.line) for f in report.findings} == EXPECTED[name], report.findings
    assert all(f.message and f.hint for f in report.findings)


def test_findings_name_what_the_built_name_is():
    (rebound,) = lint.check_file(ATTACKS / "rot13_rebound.py", guard=False).findings
    assert rebound.message == ("`getattr` reaches `Stream`, a name built at run time from pieces (the server refuses"
                               " that word)")
    (wrapped,) = lint.check_file(ATTACKS / "rot13_wrapper.py", guard=False).findings
    assert wrapped.message.startswith("`getattr` in `lookup` reaches `Stream`")
    (pickled,) = lint.check_file(ATTACKS / "pickle_embedded.py", guard=False).findings
    assert pickled.message == "`pickle.loads` loads embedded pickled bytes that call `builtins.exec`"
    planted = lint.check_file(ATTACKS / "plant_module.py", guard=False).findings
    assert [f.message.split(":")[0] for f in planted] == ["writes `hmac.py`", "opens for writing `zz_popkit.pth`",
                                                          "writes `utils.py`"]
    (loaded,) = lint.check_file(ATTACKS / "importlib_task_file.py", guard=False).findings
    assert loaded.message == "`importlib.util.spec_from_file_location` loads `reference.py`, a task file, by its path"


# ------------------------------------------------------------------ other members of each class

S = "Str"
MORE = [
    # codecs and other folds
    ("import codecs, torch\nS = getattr(torch.cuda, codecs.lookup('rot13').decode('Fgernz')[0])\n", "dynamic-name", "error"),
    ("import codecs, torch\nS = getattr(torch.cuda, codecs.encode('Fgernz', encoding='rot13'))\n", "dynamic-name", "error"),
    ("import torch\nS = getattr(torch.cuda, ''.join(c for c in 'xSxtxrxexaxm' if c != 'x'))\n", "dynamic-name", "error"),
    ("import torch\nS = getattr(torch.cuda, ''.join([chr(c) for c in range(83, 84)]) + 'tream')\n", "dynamic-name", "error"),
    ("import torch\nn = ''\nfor c in 'maertS':\n    n = c + n\nS = getattr(torch.cuda, n)\n", "dynamic-name", "error"),
    ("import torch\ndef pick():\n    return 'synchro' + 'nize'\nS = getattr(torch.cuda, pick())\n", "dynamic-name", "error"),
    ("import torch\nfor n in ('float16', 'synchro' + 'nize'):\n    x = getattr(torch.cuda, n)\n", "dynamic-name", "error"),
    ("import torch, sys\nm = sys.modules.get('ev' + 'al')\n", "dynamic-name", "error"),
    ("import torch\nS = vars(torch.cuda).get('Str' + 'eam')\n", "dynamic-name", "error"),
    ("import torch\ng = lambda o, n: getattr(o, n)\nS = g(torch.cuda, 'synchro' + 'nize')\n", "dynamic-name", "error"),
    ("import importlib\nh = importlib.import_module(''.join(map(chr, [101, 118, 97, 108])))\n", "harness-import", "error"),
    # cannot be folded: a warning, never silence
    ("import torch\nn = ''\ni = 0\nwhile i < 3:\n    n += chr(83 + i)\n    i += 1\nS = getattr(torch.cuda, n)\n",
     "dynamic-name", "warning"),
    ("import torch, os\nS = getattr(torch.cuda, os.environ['X'] + 'eam')\n", "dynamic-name", "warning"),
    ("import torch\ndef get(o, n):\n    return getattr(o, n)\nimport os\nS = get(torch.cuda, os.environ['X'] + 'y')\n",
     "dynamic-name", "warning"),
    # code objects and code in strings
    ("import torch\nexec('torch.cuda.synchronize = lambda: None')\n", "timer-patch", "error"),
    ("import torch\nsrc = 'torch.cuda.synchro' + 'nize = None'\nexec(src)\n", "timer-patch", "error"),
    ("def f():\n    pass\ng = type(f)(f.__code__, {})\n", "code-object", "warning"),
    ("def f():\n    pass\nf.__code__ = (lambda: 1).__code__\n", "code-object", "warning"),
    ("import marshal\nc = marshal.loads(b'\\xe3')\n", "code-object", "warning"),
    # loaders of pickled objects
    ("import dill\nx = dill.loads(b'\\x80\\x04K\\x01.')\n", "unpickle", "warning"),
    ("import torch, io\nx = torch.load(io.BytesIO(b''), weights_only=False)\n", "unpickle", "warning"),
    ("import numpy as np\nx = np.load('t.npy', allow_pickle=True)\n", "unpickle", "warning"),
    ("import pickle, io\nx = pickle.Unpickler(io.BytesIO(b'cos\\nsystem\\n(S\"x\"\\ntR.')).load()\n", "unpickle", "error"),
    # modules loaded by path
    ("import runpy\ng = runpy.run_path('/tmp/x/' + 'eval.py')\n", "load-by-path", "error"),
    ("from importlib.machinery import SourceFileLoader\nm = SourceFileLoader('u', 'utils.py').load_module()\n",
     "load-by-path", "error"),
    ("import importlib.util, os\ns = importlib.util.spec_from_file_location('h', os.path.join(os.getcwd(), 'task.py'))\n",
     "load-by-path", "error"),
    ("import runpy\ng = runpy.run_module('eval')\n", "harness-import", "error"),
    ("import importlib.util, os\ns = importlib.util.spec_from_file_location('h', os.environ['P'])\n",
     "load-by-path", "warning"),
    # planted modules
    ("import os\nfd = os.open('sitecustomize.py', os.O_WRONLY | os.O_CREAT)\n", "module-write", "error"),
    ("from pathlib import Path\nPath('x.txt').rename(Path('.') / 'torch.py')\n", "module-write", "error"),
    ("import os\nos.replace('a.txt', f'{os.getcwd()}/hmac.py')\n", "module-write", "error"),
    ("import py_compile\npy_compile.compile('k.py')\n", "module-write", "error"),
    ("from pathlib import Path\nPath('__pycache__/hmac.cpython-311.pyc').write_bytes(b'')\n", "module-write", "error"),
    ("import shutil\nshutil.copy('/tmp/evil.py', '.')\n", "module-write", "error"),
    ("import os\nopen(os.environ['P'], 'w').write('x')\n", "module-write", "warning"),
]


@pytest.mark.parametrize("source, rule, severity", MORE, ids=range(len(MORE)))
def test_the_class_is_closed(source, rule, severity):
    assert (rule, severity) in _found(source + OK)


@pytest.mark.parametrize("good", [
    "import torch\nn = 'float'\nn = 'half'\nx = getattr(torch, n)\n",
    "import torch\nfor n in ('float16', 'bfloat16'):\n    x = getattr(torch, n)\n",
    "import torch\ndef get(o, n):\n    return getattr(o, n)\nx = get(torch, 'float' + '16')\n",
    "import dataclasses\ndef log(result):\n    for field in dataclasses.fields(result):\n"
    "        print(f'{field.name}', getattr(result, field.name))\n",
    "import pickle\nx = pickle.dumps([1, 2])\n",
    "import torch\nw = torch.load('w.pt')\n",
    "with open('log.txt', 'w') as f:\n    f.write('x')\n",
    "data = open('input.py').read()\n",
    "from pathlib import Path\ntext = Path('kernel.cu').read_text()\nPath('out.json').write_text('{}')\n",
    "import shutil\nshutil.copy('a.cu', 'b.cu')\n",
    "import re\np = re.compile(r'\\d+')\nq = 'a b'.replace(' ', '_')\n",
    "exec('x = 1')\n",
])
def test_honest_patterns_stay_silent(good):
    assert _found(good + OK) == set()


# ------------------------------------------------------------------ the check cannot be stalled or crashed


@pytest.mark.parametrize("source", [
    "x0 = 1\n" + "".join(f"x{i + 1} = x{i} - x{i}\n" for i in range(80)) + "import torch\ngetattr(torch, str(x80))\n",
    "x0 = 'a'\n" + "".join(f"x{i + 1} = x{i} + x{i}\n" for i in range(80)) + "import torch\ngetattr(torch, x80)\n",
    "import torch\ngetattr(torch, '%0999999999d' % 1)\n",
    "import torch\ngetattr(torch, '{:>999999999}'.format('a'))\n",
    "import torch\ngetattr(torch, 'a' * 10**9)\n",
    "import torch, codecs\ngetattr(torch, codecs.decode(b'x\\x9c' + b'\\x00' * 10, 'zlib').decode())\n",
    "import torch\ngetattr(torch, ''.join(chr(65) for _ in range(10**9)))\n",
    "import torch\n" + "".join(f"def g{i}(o, n):\n" + f"    g{i + 1}(o, n)\n" * 20 for i in range(5))
    + "def g5(o, n):\n    return getattr(o, n)\n" + "g0(torch, 'a' + 'b')\n" * 20,
], ids=["int-doubling", "str-doubling", "percent-width", "format-width", "repeat", "zlib", "range", "fan-out"])
def test_a_crafted_file_cannot_stall_the_check(source):
    start = time.monotonic()
    found = _found(source + OK)
    assert time.monotonic() - start < 20  # seconds; each takes well under one on a laptop
    assert found <= {("dynamic-name", "warning")}


@pytest.mark.parametrize("source, message", [
    ("x = " + "-" * 50000 + "1\n", "Python cannot build this file's syntax tree"),
    ("x = " + "1+" * 100000 + "1\n", "Python cannot build this file's syntax tree"),
], ids=["unary", "sum"])
def test_a_file_too_deep_to_parse_is_a_syntax_error_not_a_crash(source, message):
    report = lint.check_bytes((source + OK).encode(), "sub.py", guard=False)
    assert [(f.rule, f.severity) for f in report.findings] == [("syntax", "error")]
    assert report.findings[0].message.startswith(message)


def test_a_deep_but_valid_expression_is_checked():
    source = "import torch\nx = getattr(torch, " + "'a' + " * 2000 + "'b')\n" + OK
    compile(source, "sub.py", "exec")  # Python takes it
    assert _found(source) == {("dynamic-name", "warning")}


# ------------------------------------------------------------------------- no honest file gets a finding

EXAMPLES = sorted(p for p in (ROOT / "submissions").glob("*/*.py") if p.parent.name not in ("cheats", "wrong"))
TEMPLATES = [(task, target, style) for target, styles in render.template_names() for style in styles
             for task in ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_example_has_no_finding_at_all(path):
    # Its leaderboard is a bundled practice task: that warning is about where the file would go, not its code.
    findings = lint.check_file(path, guard=False).findings
    assert [f for f in findings if f.rule != "practice-task"] == []


@pytest.mark.parametrize("task, target, style", TEMPLATES)
def test_every_rendered_template_has_no_finding_at_all(task, target, style):
    out = render.render(data_dir("tasks") / task, leaderboard=task, target=target, style=style)
    assert lint.check_bytes(out.text.encode(), "submission.py", guard=False).findings == ()
