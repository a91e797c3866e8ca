"""`popkit tune` of `@triton.autotune` configs, statically (Triton is not installed here, nor on the GPU machine):
the configs read, each variant pinning one, the file written, the refusals, and the workflow over a stand-in
backend that judges each file by the config it runs."""

from __future__ import annotations

import ast
import re

import pytest

from popkit.errors import ExitCode, SubmissionError
from popkit.model import tunespec
from popkit.model import tunetriton
from popkit.run import runner
from popkit.tuning import freeze as tunefreeze
from popkit.tuning import workflow as tune
from popkit.tuning.result import TuneReport
from tests.test_tune import SUBMISSION, TIMES, Fake, by_label, settings  # noqa: F401 (fixtures below)
from tests.test_tune import task  # noqa: F401  (the chunksum task fixture)

KERNEL = '''import torch
import triton
import triton.language as tl
from triton import autotune, Config


@triton.autotune(
    configs=[
        triton.Config({"CHUNK": 1}, num_warps=1),
        triton.Config({"CHUNK": 256}, num_warps=4),
        triton.Config({"CHUNK": 1000}, num_warps=4, num_stages=2),
        triton.Config({"CHUNK": 4096}, num_warps=8),
    ],
    key=["n"],
)
@triton.jit
def chunk_sum(x_ptr, out_ptr, n, CHUNK: tl.constexpr):
    pass


@autotune([Config({"BLOCK": 64}), Config({"BLOCK": 128}, num_warps=2)], key=["n"])
@triton.jit
def other(x_ptr, n, BLOCK: tl.constexpr):
    pass


def custom_kernel(data):
    return data.sum()
'''


def test_the_configs_of_each_autotuned_kernel_are_the_grid():
    spec = tunetriton.spec_for(KERNEL, "k.py")
    assert isinstance(spec, tunetriton.TritonSpec) and spec.names == ("chunk_sum", "other")
    assert spec.default == {"chunk_sum": "all", "other": "all"} and not spec.allows(spec.default)
    points = list(spec.points())
    assert len(points) == 8 == spec.space_size and points[0] == {"chunk_sum": 0, "other": 0}
    assert spec.describe()[0]["configs"][2] == 'triton.Config({"CHUNK": 1000}, num_warps=4, num_stages=2)'
    assert not spec.per_call and tunetriton.config_notes(spec)[1] == \
        'chunk_sum=1: triton.Config({"CHUNK": 256}, num_warps=4)'


def test_a_variant_pins_one_config_per_kernel_and_changes_nothing_else():
    spec = tunetriton.spec_for(KERNEL, "k.py")
    text = tunespec.variant_text(KERNEL, spec, {"chunk_sum": 3, "other": 1})
    ast.parse(text)
    assert "configs=[triton.Config({\"CHUNK\": 4096}, num_warps=8)],\n    key=[\"n\"]" in text
    assert '@autotune([Config({"BLOCK": 128}, num_warps=2)], key=["n"])' in text
    assert text.count("Config(") == 2
    pattern = re.compile(r"\[\s*(triton\.)?Config\(.*?\)\s*,?\s*(Config\(.*?\)\s*,?\s*)*\]", re.S)
    assert pattern.sub("[]", text) == pattern.sub("[]", KERNEL)  # only the config lists differ
    assert tunespec.variant_text(KERNEL, spec, spec.default) == KERNEL  # `all`: the input itself
    assert tunespec.variant_text("\ufeff" + KERNEL, spec, {"chunk_sum": 0}).startswith("\ufeffimport torch")


def test_the_file_written_pins_the_winner_or_keeps_every_config():
    spec = tunetriton.spec_for(KERNEL, "k.py")
    frozen = tunefreeze.frozen_text(KERNEL, spec, {"chunk_sum": 1, "other": 0}, "chunk_sum=1 other=0 chosen")
    assert frozen.startswith("# popkit tune: chunk_sum=1 other=0 chosen\nimport torch")
    assert frozen.count("Config(") == 2 and '[triton.Config({"CHUNK": 256}, num_warps=4)]' in frozen
    kept = tunefreeze.frozen_text(KERNEL, spec, spec.default, "kept")
    assert kept == "# popkit tune: kept\n" + KERNEL


@pytest.mark.parametrize("source,message", [
    ("@triton.autotune(configs=make_configs(), key=['n'])\n@triton.jit\ndef k(n):\n    pass\n",
     "k.py:1: the configs of k's @triton.autotune are not a list popkit can read without running the file"),
    ("@triton.autotune(configs=[*BASE, triton.Config({})], key=['n'])\n@triton.jit\ndef k(n):\n    pass\n",
     "k.py:1: k's config list unpacks another (`*`)"),
    ("@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef k(n):\n    pass\n",
     "k.py:1: the configs of k's @triton.autotune are not a list"),
])
def test_config_lists_popkit_cannot_read_are_refused_by_line(source, message):
    with pytest.raises(SubmissionError) as info:
        tunetriton.spec_for(source, "k.py")
    assert str(info.value).startswith(message) and info.value.exit_code == ExitCode.BAD_SUBMISSION


def test_popkit_tune_lines_win_over_autotune_and_a_plain_file_is_still_refused():
    both = "#!POPKIT tune X=1,2\nX = 1\n" + KERNEL
    assert not isinstance(tunetriton.spec_for(both, "k.py"), tunetriton.TritonSpec)
    with pytest.raises(SubmissionError, match="no `#!POPKIT tune NAME=V1,V2,...` line: nothing to tune"):
        tunetriton.spec_for("def custom_kernel(data):\n    return data\n", "k.py")


SINGLE = KERNEL.split("\n\n\n@autotune")[0] + "\n\n\ndef custom_kernel(data):\n    return data.sum()\n"


class TritonFake(Fake):
    """Judges a file by the config its kernel runs: one config, that CHUNK's times; every config (the input,
    Triton autotuning at run time), the times of CHUNK=256."""

    def per_shape(self, text):
        (autotune,) = tunetriton.find(text)
        chunks = [int(re.search(r'"CHUNK": (\d+)', c).group(1)) for c in autotune.configs]
        chunk = chunks[0] if len(chunks) == 1 else 256
        return [self.times[chunk]] * 2

    @staticmethod
    def label(text):
        (autotune,) = tunetriton.find(text)
        return "all" if len(autotune.configs) > 1 else autotune.configs[0]


def test_tune_races_the_configs_confirms_against_the_autotuned_input_and_pins_the_winner(task, tmp_path):  # noqa: F811
    source = tmp_path / "kernel.py"
    source.write_text(SINGLE)
    fake = TritonFake()
    report = tune.run_tune(task, source, tmp_path / "out.py", runner.RunOptions(),
                           settings(per_shape=True, race_decides=True), backend=fake.backend)
    v = by_label(report)
    assert set(v) == {"chunk_sum=0", "chunk_sum=1", "chunk_sum=2", "chunk_sum=3"}
    assert v["chunk_sum=2"].outcome == "failed"  # CHUNK=1000 is wrong: dropped by its check, as any variant
    assert report.winner_label == "chunk_sum=3" and report.confirmed and report.decided_by == "A/B"
    assert v["chunk_sum=3"].faster and fake.calls[("ab", "all")] > 0  # against the input, every config
    assert 'chunk_sum=3: triton.Config({"CHUNK": 4096}, num_warps=8)' in report.notes
    text = (tmp_path / "out.py").read_text()
    assert text.count("triton.Config(") == 1 and '[triton.Config({"CHUNK": 4096}, num_warps=8)]' in text
    assert report.parameters[0]["configs"][3] == 'triton.Config({"CHUNK": 4096}, num_warps=8)'
    assert TuneReport.from_json(report.to_json()) == report


def test_the_comment_written_on_line_1_never_reads_as_an_encoding_declaration():
    source = SINGLE.replace("chunk_sum", "decoding")
    spec = tunetriton.spec_for(source, "k.py")
    frozen = tunefreeze.frozen_text(source, spec, {"decoding": 1}, "decoding=1 chosen on cpu")
    assert frozen.splitlines()[0] == "# popkit tune: decoding =1 chosen on cpu"
    compile(frozen, "k.py", "exec")  # `decoding=1` on line 1 would be read as the encoding "1": a SyntaxError
