"""`#!POPKIT tune` declarations (tunespec) and the file tune writes (tunefreeze): parsing, the tune-if
evaluator, the grid, variants, and the per-shape dispatch running on stand-in tensors."""

from __future__ import annotations

import ast

import pytest

from popkit.check import lint
from popkit.errors import ExitCode, SubmissionError
from popkit.model import tunespec
from popkit.tuning import freeze as tunefreeze

BASE = '''#!POPCORN leaderboard vectoradd
#!POPKIT tune BLOCK=64,128, 256
#!POPKIT tune VEC = 1,2,4
#!POPKIT tune-if BLOCK * VEC <= 512 and VEC in (1, 2, 4)
import torch

BLOCK = 128  # threads per block
VEC: int = 2


def custom_kernel(data):
    return BLOCK + VEC
'''


def parse(text: str = BASE) -> tunespec.TuneSpec:
    return tunespec.parse(text, "s.py")


def error(text: str) -> str:
    with pytest.raises(SubmissionError) as info:
        parse(text)
    assert info.value.exit_code == ExitCode.BAD_SUBMISSION
    return info.value.message


def test_parameters_defaults_and_the_constrained_grid_in_order():
    spec = parse()
    assert [(p.name, p.values, p.line, p.assign_line, p.default) for p in spec.parameters] == [
        ("BLOCK", (64, 128, 256), 2, 7, 128), ("VEC", (1, 2, 4), 3, 8, 2)]
    assert spec.default == {"BLOCK": 128, "VEC": 2} and spec.space_size == 9
    assert [tunespec.label(p) for p in spec.points()] == [
        "BLOCK=64 VEC=1", "BLOCK=64 VEC=2", "BLOCK=64 VEC=4", "BLOCK=128 VEC=1", "BLOCK=128 VEC=2",
        "BLOCK=128 VEC=4", "BLOCK=256 VEC=1", "BLOCK=256 VEC=2"]  # 256 * 4 > 512: excluded


def test_a_variant_rewrites_only_the_assigned_values():
    spec = parse()
    text = tunespec.variant_text(BASE, spec, {"BLOCK": 256, "VEC": 1})
    changed = [(a, b) for a, b in zip(BASE.splitlines(), text.splitlines()) if a != b]
    assert changed == [("BLOCK = 128  # threads per block", "BLOCK = 256  # threads per block"),
                       ("VEC: int = 2", "VEC: int = 1")]
    assert tunespec.parse(text, "v.py").default == {"BLOCK": 256, "VEC": 1}  # a variant is tunable again


def test_values_are_written_as_the_tune_line_spells_them_and_unicode_columns_hold():
    text = "#!POPKIT tune S=0x10, 1e-3\n# é ü\nS = 0x20  # größe\n"
    spec = tunespec.parse(text, "s.py")
    assert spec.parameters[0].values == (16, 0.001)
    assert tunespec.variant_text(text, spec, {"S": 0.001}).splitlines()[2] == "S = 1e-3  # größe"
    assert tunespec.variant_text("\ufeff" + text, spec, {"S": 16}).startswith("\ufeff#!POPKIT")


@pytest.mark.parametrize("change,message", [
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune VEC = 1,x,4\n"), "s.py:3: `VEC`: `x` is not a number literal"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune VEC = 1,2,2\n"), "s.py:3: `VEC` lists 2 twice"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune VEC\n"), "s.py:3: expected `#!POPKIT tune NAME=V1,V2,...` "
                                                             "(got `VEC`)"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune VEC=\n"), "s.py:3: `VEC` needs a comma-separated list of "
                                                              "numbers (got ``)"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune BLOCK=1\n"), "s.py:3: parameter `BLOCK` declared twice "
                                                                 "(first on line 2)"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune VEC=True,2\n"), "s.py:3: `VEC`: `True` is not a number literal"),
    (("#!POPKIT tune VEC = 1,2,4\n", "#!POPKIT tune-vec 1\n"), "s.py:3: unknown `#!POPKIT` line `tune-vec` "
                                                               "(known: tune, tune-if)"),
    (("VEC: int = 2\n", ""), "s.py:3: `VEC` is declared but never assigned at module level"),
    (("VEC: int = 2\n", "VEC = 2\nVEC = 4\n"), "s.py:9: `VEC` is bound more than once at module level (also line 8):"
                                               " popkit tune rewrites one assignment"),
    (("VEC: int = 2\n", "VEC = 2 * 1\n"), "s.py:8: `VEC` must be assigned a number literal (`VEC = 1`), not "
                                          "`VEC = 2 * 1`"),
    (("VEC: int = 2\n", "VEC = VEC2 = 2\n"), "s.py:8: `VEC` must be assigned a number literal (`VEC = 1`), not "
                                             "`VEC = VEC2 = 2`"),
    (("<= 512 and", "<= SIZE and"), "s.py:4: tune-if names `SIZE`, which is no tune parameter (parameters: "
                                    "BLOCK, VEC)"),
    (("BLOCK * VEC <= 512", "__import__('os')"), "s.py:4: tune-if: `__import__('os')`: the only calls are min, max "
                                                 "and abs, with plain arguments"),
    (("BLOCK * VEC <= 512", "BLOCK.real > 1"), "s.py:4: tune-if: `BLOCK.real` is not allowed"),
    (("BLOCK * VEC <= 512", "BLOCK <"), "s.py:4: tune-if: `BLOCK < and VEC in (1, 2, 4)` is not an expression"),
    (("BLOCK * VEC <= 512", "'a' < 'b'"), "s.py:4: tune-if: `'a'`: only numbers, True and False"),
])
def test_bad_declarations_name_the_line(change, message):
    old, new = change
    assert old in BASE
    got = error(BASE.replace(old, new))
    assert got.startswith(message), got


def test_no_declaration_and_an_empty_grid():
    assert error("def custom_kernel(d):\n    return d\n") == "s.py: no `#!POPKIT tune NAME=V1,V2,...` line: nothing to tune"
    spec = parse(BASE.replace("BLOCK * VEC <= 512", "BLOCK > 1000"))
    assert list(spec.points()) == []


def test_the_evaluator_covers_its_forms_and_refuses_division_by_zero():
    spec = parse(BASE.replace("#!POPKIT tune-if BLOCK * VEC <= 512 and VEC in (1, 2, 4)",
                              "#!POPKIT tune-if (BLOCK // VEC if VEC else 0) % 64 == 0 and max(BLOCK, 2**VEC) >= "
                              "abs(-64) and not BLOCK / VEC < 16 or min(VEC, 3) == 3"))
    assert tunespec.label(next(spec.points())) == "BLOCK=64 VEC=1"
    zero = parse(BASE.replace("BLOCK * VEC <= 512", "BLOCK / (VEC - 1) > 0"))
    with pytest.raises(SubmissionError) as info:
        list(zero.points())
    assert info.value.message == "s.py:4: tune-if: `BLOCK / (VEC - 1) > 0 and VEC in (1, 2, 4)` divides by zero at BLOCK=64 VEC=1"
    power = parse(BASE.replace("BLOCK * VEC <= 512", "2 ** BLOCK > 1"))
    with pytest.raises(SubmissionError, match="exponent 64 is above 64|exponent 128 is above 64"):
        list(power.points())


def test_a_sample_is_seeded_keeps_the_default_and_grid_order():
    points = [{"A": a} for a in range(100)]
    first = tunespec.sample(points, 10, seed=3, keep={"A": 57})
    assert first == tunespec.sample(points, 10, seed=3, keep={"A": 57}) and {"A": 57} in first
    assert len(first) == 10 and first == sorted(first, key=lambda p: p["A"])
    assert tunespec.sample(points, 10, seed=4, keep={"A": 57}) != first
    assert tunespec.sample(points, 200, seed=3) == points


def test_reads_at_import_are_found_reads_in_functions_are_not():
    text = ("A = 1\nB = 2\nC = 3\nD = 4\nSRC = f'-DA={A}'\n@decorate(B)\ndef f(x, c=C):\n    return D\n"
            "g = lambda y, d=D: y\n")
    assert tunespec.read_time_uses(text, ["A", "B", "C", "D"]) == {"A": 5, "B": 6, "C": 7, "D": 9}
    assert tunespec.read_time_uses(BASE, ["BLOCK", "VEC"]) == {}


def test_check_warns_about_a_bad_declaration_and_never_errs():
    report = lint.check_bytes(BASE.replace("1,2,4", "1,two").encode(), "s.py", guard=False)
    assert [(f.rule, f.severity, f.line, f.message) for f in report.findings] == [
        ("popkit-tune", "warning", 3, "`popkit tune` refuses it: `VEC`: `two` is not a number literal")]
    assert report.ok and lint.check_bytes(BASE.encode(), "s.py", guard=False).findings == ()


# ------------------------------------------------------------------------------- the written file


class Stand:
    """What the dispatch looks at in a tensor: its shape and that it has a dtype."""

    def __init__(self, *shape):
        self.shape, self.dtype = shape, "float32"


def test_frozen_text_sets_values_and_says_what_was_chosen():
    spec = parse()
    text = tunefreeze.frozen_text(BASE, spec, {"BLOCK": 64, "VEC": 4}, "BLOCK=64 VEC=4 chosen on cpu: 0.5x")
    lines = text.splitlines()
    assert lines[4] == "# popkit tune: BLOCK=64 VEC=4 chosen on cpu: 0.5x"  # in the leading comment block
    assert "BLOCK = 64  # threads per block" in lines and "VEC: int = 4" in lines
    assert tunespec.parse(text, "o.py").default == {"BLOCK": 64, "VEC": 4}
    odd = tunefreeze.frozen_text(BASE, spec, spec.default, "the " + "str" + "eam of it")
    assert "str" + "eam" not in odd.lower()


def test_per_shape_dispatch_sets_the_values_for_each_input_then_calls_the_original():
    spec = parse()
    table = [(((4096,), (4096,)), {"BLOCK": 256, "VEC": 1}, "size: 4096; seed: 1"),
             (((64,), (64,)), {"BLOCK": 64, "VEC": 4}, "size: 64; seed: 2")]
    text = tunefreeze.per_shape_text(BASE, spec, {"BLOCK": 128, "VEC": 2}, table, "per-shape values")
    assert "#!POPKIT" not in text and "# tuned per shape by popkit tune: tune BLOCK=64,128, 256" in text
    assert lint.check_bytes(text.encode(), "o.py", guard=False).ok
    module: dict = {}
    exec(compile(text.replace("import torch\n", ""), "o.py", "exec"), module)
    kernel = module["custom_kernel"]
    assert kernel((Stand(4096), Stand(4096))) == 257  # the original read the values set for this input
    assert kernel([Stand(64), Stand(64)]) == 68
    assert kernel({"a": Stand(7), "b": 3}) == 130  # a shape not in the table: the overall winner's values
    ast.parse(text)
