"""Task and problem-set loading: every error names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import TaskError
from popkit.model.tasks import list_tasks, load_task, problem_sets, resolve_task, shadowed_tasks, task_roots

FIX = Path(__file__).parent / "fixtures" / "tasks"
GOOD = """\
files:
  - {name: submission.py, source: "@SUBMISSION@"}
  - {name: eval.py, source: eval.py}
lang: py
description: A task.
config: {main: eval.py}
tests:
  - {size: 1, seed: 2}
benchmarks:
  - {size: 3, seed: 4}
"""


def write_task(root: Path, text: str = GOOD, name: str = "t") -> Path:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "task.yml").write_text(text)
    (d / "eval.py").write_text("")
    return d


def test_defaults_follow_the_protocol(tmp_path):
    task = load_task(write_task(tmp_path))
    assert (task.test_timeout, task.benchmark_timeout, task.ranked_timeout) == (180, 180, 180)
    assert task.ranking_by == "last" and task.multi_gpu is False and task.submission_name == "submission.py"
    assert task.timeout_for("leaderboard") == 180


@pytest.mark.parametrize("edit,message", [
    (lambda t: t + "extra: 1\n", "task.yml: unknown key `extra` (the runner rejects it)"),
    (lambda t: t.replace("lang: py\n", ""), "task.yml: missing required key `lang`"),
    (lambda t: t.replace("tests:\n  - {size: 1, seed: 2}\n", "tests: {size: 1}\n"),
     "task.yml: key `tests` must be a list (got a mapping)"),
    (lambda t: t.replace("  - {size: 3, seed: 4}\n", "  - {size: 3, seed: {a: 1}}\n"),
     "task.yml: key `benchmarks[0].seed` must be a number, string, boolean or list (got a mapping)"),
    (lambda t: t.replace("source: eval.py", "source: ../nowhere.py"),
     "task.yml: key `files[1].source`: file `../nowhere.py` not found"),
    (lambda t: t + "ranking_by: median\n", "task.yml: key `ranking_by` must be `last`, `mean` or `geom` (got str 'median')"),
    (lambda t: t + "test_timeout: -3\n",
     "task.yml: key `test_timeout` must be a positive number of seconds, at most 86400 (got int -3)"),
    (lambda t: t + "test_timeout: .inf\n",
     "task.yml: key `test_timeout` must be a positive number of seconds, at most 86400 (got float inf)"),
    (lambda t: t + "benchmark_timeout: .nan\n",
     "task.yml: key `benchmark_timeout` must be a positive number of seconds, at most 86400 (got float nan)"),
    (lambda t: t + "ranked_timeout: 0\n",
     "task.yml: key `ranked_timeout` must be a positive number of seconds, at most 86400 (got int 0)"),
    (lambda t: t + "test_timeout: true\n",
     "task.yml: key `test_timeout` must be a positive number of seconds, at most 86400 (got bool True)"),
    (lambda t: t + "test_timeout: 1.0e+300\n",
     "task.yml: key `test_timeout` must be a positive number of seconds, at most 86400 (got float 1e+300)"),
    (lambda t: t.replace("{name: eval.py, source: eval.py}", '{name: "eval\\0.py", source: eval.py}'),
     "task.yml: key `files[1].name` holds a NUL character ('eval\\x00.py')"),
    (lambda t: t.replace("source: eval.py", 'source: "eval.py\\0"'),
     "task.yml: key `files[1].source` holds a NUL character ('eval.py\\x00')"),
    (lambda t: t.replace("source: eval.py", "source: ../../../../../../../../etc/passwd"),
     "task.yml: key `files[1].source`: `../../../../../../../../etc/passwd` is outside the problem set"),
    (lambda t: t.replace("source: eval.py", "source: /etc/passwd"),
     "task.yml: key `files[1].source`: `/etc/passwd` is outside the problem set"),
    (lambda t: t.replace("{main: eval.py}", "{main: other.py}"),
     "task.yml: key `config.main`: `other.py` is not one of the names in `files`"),
    (lambda t: t.replace('"@SUBMISSION@"', "eval.py"),
     "task.yml: key `files` must have exactly one entry with source '@SUBMISSION@'"),
    (lambda t: t + "multi_gpu: true\n", "task.yml: key `tests[0]` needs `world_size` (the task has multi_gpu: true)"),
    (lambda t: "files: [\n", "task.yml: line 2: invalid YAML"),
    (lambda t: "- just\n- a list\n", "task.yml: must be a mapping of keys (got a list)"),
    (lambda t: "files: " + "[" * 5000 + "]" * 5000 + "\n", "task.yml: nested too deeply to read"),
    (lambda t: "files: " + "[" * 30 + "]" * 30 + "\n", "task.yml: nested over 20 deep"),
    (lambda t: t + "templates: {Python: x}\n" + "".join(
        f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "z"] * 10) + "]\n" for i in range(9)),
     "task.yml: over 100,000 values (YAML aliases counted as expanded)"),
])
def test_malformed_task_yml_names_file_and_key(tmp_path, edit, message):
    d = write_task(tmp_path, edit(GOOD))
    with pytest.raises(TaskError) as info:
        load_task(d)
    assert str(info.value).startswith(str(d / "task.yml") + ": " + message.removeprefix("task.yml: "))
    assert info.value.exit_code == 3


def test_missing_task_directory(tmp_path):
    with pytest.raises(TaskError, match="not a task directory"):
        load_task(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="task.yml not found"):
        load_task(tmp_path / "empty")


def test_problem_set_names_resolve_under_roots(tmp_path, monkeypatch):
    write_task(tmp_path / "set", name="vec_py")
    (tmp_path / "set" / "mine.yaml").write_text(
        "name: my set\ndeadline: 2030-01-01\ndescription: d\n"
        "problems:\n  - {directory: vec_py, name: my_vectoradd, deadline: 2030-01-01, gpus: [H100, L4]}\n")
    (tmp_path / "set" / "other.yaml").write_text("just: some yaml\n")  # not a problem set: ignored
    task = resolve_task("my_vectoradd", task_roots([tmp_path / "set"]))
    assert (task.name, task.leaderboard, task.gpus) == ("vec_py", "my_vectoradd", ("H100", "L4"))
    monkeypatch.setenv("POPKIT_TASKS_PATH", str(tmp_path / "set"))
    assert resolve_task("my_vectoradd", task_roots()).leaderboard == "my_vectoradd"
    assert [p.name for ps in problem_sets(task_roots()) for p in ps.problems] == ["my_vectoradd"]


def test_ambiguous_and_unknown_names(tmp_path):
    for name in ("a", "b"):
        write_task(tmp_path, name=f"task_{name}")
        (tmp_path / f"{name}.yaml").write_text(f"name: {name}\nproblems:\n  - {{directory: task_{name}, name: dup}}\n")
    with pytest.raises(TaskError, match="leaderboard `dup` is named by several problem sets"):
        resolve_task("dup", [tmp_path])
    with pytest.raises(TaskError) as info:
        resolve_task("dupe", [tmp_path])
    assert "no task named `dupe`" in info.value.message and "did you mean dup" in info.value.hint


def test_tasks_root_must_exist(tmp_path):
    with pytest.raises(TaskError, match="tasks root does not exist"):
        task_roots([tmp_path / "missing"])


def test_task_dir_path_and_task_yml_path_both_load():
    assert resolve_task(str(FIX / "double")).name == "double"
    assert resolve_task(str(FIX / "double" / "task.yml")).name == "double"


def test_sources_are_confined_to_the_problem_set_folder(tmp_path):
    """The layout of the public sets: linalg/eigh_py takes ../../pmpp_v2/utils.py beside the set's yaml."""
    sets = tmp_path / "problems"
    (sets / "shared").mkdir(parents=True)
    (sets / "shared" / "utils.py").write_text("")
    task_dir = write_task(sets / "linalg", GOOD.replace("source: eval.py", "source: ../../shared/utils.py"),
                          name="eigh_py")
    (sets / "linalg.yaml").write_text("name: l\nproblems:\n  - {directory: linalg/eigh_py, name: eigh}\n")
    assert resolve_task("eigh", [sets]).files[1].source == "../../shared/utils.py"
    assert load_task(task_dir).files[1].source == "../../shared/utils.py"  # by directory: its set is found
    (sets / "linalg.yaml").unlink()  # no set names it: the task's own parent folder is the limit
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert info.value.message.endswith(
        "key `files[1].source`: `../../shared/utils.py` is outside the problem set (" + str(sets / "linalg") + ")")
    assert info.value.exit_code == 3


def test_a_symlink_out_of_the_problem_set_is_refused(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    task_dir = write_task(tmp_path / "set", GOOD.replace("source: eval.py", "source: link.py"))
    (task_dir / "link.py").symlink_to(secret)
    with pytest.raises(TaskError, match=r"key `files\[1\].source`: `link.py` is outside the problem set"):
        load_task(task_dir)


@pytest.mark.parametrize("escape", ["../outside/escaped", "absolute", "link", "fine/../../outside/escaped"])
def test_a_problem_set_entry_outside_the_sets_folder_is_refused(tmp_path, escape):
    """As a task's `files` are: a set cannot point popkit at a task folder outside its own folder."""
    outside = write_task(tmp_path / "outside", name="escaped")  # a valid task, just not the set's
    sets = tmp_path / "sets"
    write_task(sets, name="fine")
    directory = {"absolute": str(outside), "link": "link"}.get(escape, escape)
    if escape == "link":
        (sets / "link").symlink_to(outside, target_is_directory=True)
    yml = sets / "mine.yaml"
    yml.write_text(f"name: s\nproblems:\n  - {{directory: fine, name: fine}}\n"
                   f"  - {{directory: '{directory}', name: escaped}}\n")
    with pytest.raises(TaskError) as info:
        resolve_task("escaped", [sets])
    assert info.value.message == (f"{yml}: problems[1] (`escaped`): directory `{directory}` resolves outside the"
                                  f" set's folder ({sets.resolve()})")
    assert info.value.exit_code == 3
    skipped: list = []
    listed = list_tasks([sets], skipped)  # the set's other entry still lists; this one is skipped, named
    assert "fine" in [t.leaderboard for t in listed] and "escaped" not in [t.leaderboard for t in listed]
    assert [(s.problem_set, s.leaderboard) for s in skipped] == [(yml.resolve(), "escaped")]
    assert shadowed_tasks("escaped", [sets]) == []


def test_a_problem_set_entry_outside_its_folder_stops_the_cli_with_exit_3(tmp_path):
    write_task(tmp_path / "outside", name="escaped")
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "mine.yaml").write_text("name: s\nproblems:\n  - {directory: ../outside/escaped, name: escaped}\n")
    sub = tmp_path / "sub.py"
    sub.write_text("def custom_kernel(data):\n    return data\n")
    result = CliRunner().invoke(app, ["test", str(sub), "--task", "escaped", "--tasks-root", str(sets), "--no-history"],
                                env={"POPKIT_WIDTH": "300", "NO_COLOR": "1"})
    assert result.exit_code == 3, result.output
    assert (f"error: {sets / 'mine.yaml'}: problems[0] (`escaped`): directory `../outside/escaped` resolves outside"
            f" the set's folder ({sets.resolve()})") in result.output


def _public_problems() -> Path | None:
    for candidate in (Path("/work/refk/problems"), Path(__file__).resolve().parents[1] / ".refk" / "problems"):
        if candidate.is_dir():
            return candidate
    return None


@pytest.mark.skipif(_public_problems() is None, reason="no checkout of the public problem sets")
def test_every_public_task_still_loads():
    skipped: list = []
    public = [t for t in list_tasks([_public_problems()], skipped) if not t.bundled]
    assert skipped == [] and len(public) == 42


def test_popkits_own_task_files_may_be_named_from_anywhere(tmp_path):
    from popkit.resources import data_dir

    task_dir = write_task(tmp_path / "set", GOOD.replace("source: eval.py", f"source: {data_dir('tasks') / 'eval.py'}"))
    assert load_task(task_dir).files[1].source.endswith("eval.py")


def test_a_yaml_nested_past_the_stack_under_a_root_is_not_a_problem_set(tmp_path):
    (tmp_path / "deep.yaml").write_text("[" * 5000 + "]" * 5000)
    assert problem_sets([tmp_path]) == []


def test_the_bundled_set_is_read_once_per_version_of_its_file(tmp_path, monkeypatch):
    """Resolving a bundled name and looking for tasks it hides both need popkit's own problem set: one read."""
    import shutil

    from popkit.model import tasks

    shutil.copytree(Path(tasks.data_dir("tasks")), tmp_path / "tasks")
    monkeypatch.setattr(tasks, "data_dir", lambda name: tmp_path / name)
    reads = []
    load = tasks.load_problem_set
    monkeypatch.setattr(tasks, "load_problem_set", lambda path: reads.append(path) or load(path))
    first = tasks.bundled_problem_set()
    assert resolve_task("vectoradd").bundled and shadowed_tasks("vectoradd") == []
    assert tasks.bundled_problem_set() is first and len(reads) == 1
    index = tmp_path / "tasks" / "problems.yaml"
    index.write_text(index.read_text().replace("name: vectoradd", "name: vectoradd_renamed"))
    assert tasks.bundled_problem_set() is not first and len(reads) == 2
    assert any(p.name == "vectoradd_renamed" for p in tasks.bundled_problem_set().problems)
