"""Tasks and problem sets in the leaderboard's format (docs/protocol-notes.md §1), validated on load.

A task is a directory holding task.yml and the files it names. A problem set is a yaml file whose
`problems` list maps leaderboard names to task directories. Every error names the file and the key.
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from popkit.errors import TaskError, UsageError
from popkit.model.yamlfile import display_path, read_yaml
from popkit.resources import data_dir

SUBMISSION_SOURCE = "@SUBMISSION@"
MODES = ("test", "benchmark", "leaderboard", "profile")
RANKINGS = ("last", "mean", "geom")
LANGS = ("py", "cu")
DEFAULT_TIMEOUT_S = 180
MAX_TIMEOUT_S = 86400  # a day: finite, and far above any real task's limit (the largest is 900 s)
_ALLOWED_KEYS = {
    "files", "lang", "description", "config", "templates", "tests", "benchmarks",
    "test_timeout", "benchmark_timeout", "ranked_timeout", "ranking_by", "multi_gpu", "seed", "gpus",
}
_REQUIRED_KEYS = ("files", "lang", "description", "config")
_TEMPLATE_LANGS = ("Python", "CUDA", "HIP", "Triton", "CuteDSL")


@dataclass(frozen=True)
class TaskFile:
    name: str  # file name inside the working directory
    source: str  # "@SUBMISSION@" or a path relative to the task directory


@dataclass(frozen=True)
class Task:
    """One validated task. Timeouts are seconds for one eval process of that mode."""

    name: str  # the task directory's name
    path: Path  # the task directory
    files: tuple[TaskFile, ...]
    lang: str
    description: str
    main: str  # config.main: the eval file run as `python <main> MODE CASES`
    templates: Mapping[str, str] = field(default_factory=dict)
    tests: tuple[Mapping[str, Any], ...] = ()
    benchmarks: tuple[Mapping[str, Any], ...] = ()
    test_timeout: float = DEFAULT_TIMEOUT_S
    benchmark_timeout: float = DEFAULT_TIMEOUT_S
    ranked_timeout: float = DEFAULT_TIMEOUT_S
    ranking_by: str = "last"
    multi_gpu: bool = False
    seed: int | None = None
    gpus: tuple[str, ...] = ()
    leaderboard: str | None = None  # the leaderboard name, when a problem set names this task
    bundled: bool = False
    deadline: str | None = None  # the leaderboard's (or its set's) deadline, as the problem set writes it

    @property
    def yml(self) -> Path:
        return self.path / "task.yml"

    @property
    def submission_name(self) -> str:
        """The name the user's file gets in the working directory, whatever the user called it."""
        return next(f.name for f in self.files if f.source == SUBMISSION_SOURCE)

    @property
    def display_name(self) -> str:
        return self.leaderboard or self.name

    def timeout_for(self, mode: str) -> float:
        if mode == "test":
            return self.test_timeout
        if mode == "leaderboard":
            return self.ranked_timeout
        return self.benchmark_timeout

    def cases_for(self, mode: str) -> list[Mapping[str, Any]]:
        """Test mode gets every test; the others every benchmark, or only the last under `ranking_by: last`."""
        if mode == "test":
            return list(self.tests)
        if self.ranking_by == "last" and self.benchmarks:
            return [self.benchmarks[-1]]
        return list(self.benchmarks)


@dataclass(frozen=True)
class Problem:
    directory: str
    name: str  # leaderboard name
    deadline: str | None = None
    gpus: tuple[str, ...] = ()
    index: int = 0  # its place in the set's `problems` list


@dataclass(frozen=True)
class ProblemSet:
    path: Path
    name: str
    problems: tuple[Problem, ...]
    description: str = ""
    deadline: str | None = None

    def task_dir(self, problem: Problem) -> Path:
        """The entry's task folder, which must lie inside the set's folder, symlinks resolved (as a task's
        `files` must): a set cannot point popkit at `/etc`, `../x` or a link out. TaskError (exit 3) otherwise."""
        root = self.path.parent.resolve()
        directory = (root / problem.directory).resolve()
        if not directory.is_relative_to(root):
            raise TaskError(f"{display_path(self.path)}: problems[{problem.index}] (`{problem.name}`): directory "
                            f"`{problem.directory}` resolves outside the set's folder ({root})",
                            "a problem set names task folders inside its own folder; move the task there")
        return directory


# ---------------------------------------------------------------------------------------- loading


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


class _Checker:
    """Validation helpers that name the file and the key in every message."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, message: str, hint: str = "") -> TaskError:
        return TaskError(f"{display_path(self.path)}: {message}", hint)

    def expect(self, ok: bool, key: str, wanted: str, value: Any) -> None:
        if not ok:
            raise self.fail(f"key `{key}` must be {wanted} (got {_kind(value)})")

    def number(self, raw: Mapping, key: str, default: float) -> float:
        value = raw.get(key, default)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_TIMEOUT_S
        self.expect(ok, key, f"a positive number of seconds, at most {MAX_TIMEOUT_S}", value)
        return float(value)

    def text(self, key: str, value: str) -> str:
        """A string that becomes a path: a NUL character would stop the OS (and popkit) cold."""
        if "\0" in value:
            raise self.fail(f"key `{key}` holds a NUL character ({value!r})")
        return value

    def cases(self, raw: Mapping, key: str, multi_gpu: bool) -> tuple[dict, ...]:
        value = raw.get(key) or []
        self.expect(isinstance(value, list), key, "a list", value)
        out = []
        for i, case in enumerate(value):
            self.expect(isinstance(case, Mapping) and case, f"{key}[{i}]", "a non-empty mapping", case)
            for k, v in case.items():
                self.expect(isinstance(v, (int, float, str, bool, list)), f"{key}[{i}].{k}",
                            "a number, string, boolean or list", v)
            if multi_gpu and "world_size" not in case:
                raise self.fail(f"key `{key}[{i}]` needs `world_size` (the task has multi_gpu: true)")
            out.append(dict(case))
        return tuple(out)


def load_task(path: Path | str, *, leaderboard: str | None = None, gpus: Sequence[str] = (),
              bundled: bool = False, set_root: Path | None = None) -> Task:
    """Load and validate the task in directory `path` (or the task.yml file itself).

    Its files must lie inside `set_root`, the folder of the problem-set yaml that names it; for a task
    loaded by its directory, that of a problem set beside it or one level up that names it, else the
    task's parent folder.
    """
    path = Path(path).expanduser()
    directory = path.parent if path.name in ("task.yml", "task.yaml") else path
    if not directory.is_dir():
        raise TaskError(f"{directory}: not a task directory", "give a directory that holds task.yml")
    yml = directory / "task.yml"
    raw = read_yaml(yml, "task.yml")
    check = _Checker(yml)
    if not isinstance(raw, Mapping):
        raise check.fail(f"must be a mapping of keys (got {_kind(raw)})")
    unknown = sorted(set(map(str, raw)) - _ALLOWED_KEYS)
    if unknown:
        raise check.fail(f"unknown key `{unknown[0]}` (the runner rejects it)",
                         "allowed keys: " + ", ".join(sorted(_ALLOWED_KEYS)))
    for key in _REQUIRED_KEYS:
        if key not in raw:
            raise check.fail(f"missing required key `{key}`")

    files_raw = raw["files"]
    check.expect(isinstance(files_raw, list) and files_raw, "files", "a non-empty list", files_raw)
    files = []
    for i, entry in enumerate(files_raw):
        check.expect(isinstance(entry, Mapping), f"files[{i}]", "a mapping with name and source", entry)
        for k in ("name", "source"):
            check.expect(isinstance(entry.get(k), str) and entry.get(k), f"files[{i}].{k}", "a string", entry.get(k))
        name, source = check.text(f"files[{i}].name", entry["name"]), check.text(f"files[{i}].source", entry["source"])
        if "/" in name or "\\" in name or name in (".", ".."):
            raise check.fail(f"key `files[{i}].name` must be a plain file name (got {name!r})")
        if source != SUBMISSION_SOURCE:
            set_root = set_root or _set_root(directory)
            resolved = (directory / source).resolve()
            if not (resolved.is_relative_to(set_root) or resolved.is_relative_to(_BUNDLED)):
                raise check.fail(f"key `files[{i}].source`: `{source}` is outside the problem set ({set_root})",
                                 "a task may use files of its own problem set only (the folder of its yaml)")
            if not resolved.is_file():
                raise check.fail(f"key `files[{i}].source`: file `{source}` not found", f"looked for {resolved}")
        files.append(TaskFile(name, source))
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise check.fail(f"key `files`: the name `{dup}` appears twice")
    if sum(f.source == SUBMISSION_SOURCE for f in files) != 1:
        raise check.fail(f"key `files` must have exactly one entry with source {SUBMISSION_SOURCE!r}")

    lang = raw["lang"]
    check.expect(lang in LANGS, "lang", "`py` or `cu`", lang)
    description = raw["description"]
    check.expect(isinstance(description, str), "description", "a string", description)
    config = raw["config"]
    check.expect(isinstance(config, Mapping), "config", "a mapping", config)
    main = config.get("main")
    if lang == "py":
        check.expect(isinstance(main, str) and main, "config.main", "the eval file's name", main)
        if main not in names:
            raise check.fail(f"key `config.main`: `{main}` is not one of the names in `files`",
                             "files: " + ", ".join(names))

    templates = raw.get("templates") or {}
    check.expect(isinstance(templates, Mapping), "templates", "a mapping of language to file", templates)
    for lang_name, rel in templates.items():
        check.expect(lang_name in _TEMPLATE_LANGS, f"templates.{lang_name}",
                     "one of " + ", ".join(_TEMPLATE_LANGS), lang_name)
        check.expect(isinstance(rel, str), f"templates.{lang_name}", "a file path", rel)

    multi_gpu = raw.get("multi_gpu", False)
    check.expect(isinstance(multi_gpu, bool), "multi_gpu", "true or false", multi_gpu)
    ranking = raw.get("ranking_by", "last")
    check.expect(ranking in RANKINGS, "ranking_by", "`last`, `mean` or `geom`", ranking)
    seed = raw.get("seed")
    check.expect(seed is None or (isinstance(seed, int) and not isinstance(seed, bool)), "seed", "an integer", seed)
    task_gpus = raw.get("gpus") or []
    check.expect(isinstance(task_gpus, list) and all(isinstance(g, str) for g in task_gpus), "gpus",
                 "a list of GPU names", task_gpus)

    return Task(
        name=directory.resolve().name,
        path=directory.resolve(),
        files=tuple(files),
        lang=lang,
        description=description.strip(),
        main=main or "",
        templates=dict(templates),
        tests=check.cases(raw, "tests", multi_gpu),
        benchmarks=check.cases(raw, "benchmarks", multi_gpu),
        test_timeout=check.number(raw, "test_timeout", DEFAULT_TIMEOUT_S),
        benchmark_timeout=check.number(raw, "benchmark_timeout", DEFAULT_TIMEOUT_S),
        ranked_timeout=check.number(raw, "ranked_timeout", DEFAULT_TIMEOUT_S),
        ranking_by=ranking,
        multi_gpu=multi_gpu,
        seed=seed,
        gpus=tuple(gpus) or tuple(task_gpus),
        leaderboard=leaderboard,
        bundled=bundled,
    )


_BUNDLED = data_dir("tasks").resolve()  # popkit's own task files (its eval, utils.py) may be named by any task


def _set_root(directory: Path) -> Path:
    """The folder of a problem-set yaml beside the task's folder, or one level up, that names the task;
    else the task's parent folder. Parses only those of the few yaml files there that mention the task's
    folder name (a set names each task's directory; parsing every set's index cost tens of milliseconds)."""
    task_dir = directory.resolve()
    for folder in (task_dir.parent, task_dir.parent.parent):
        for path in sorted(folder.glob("*.y*ml")):
            try:
                if task_dir.name not in path.read_text(encoding="utf-8", errors="replace"):
                    continue
            except OSError:
                continue
            try:
                pset = load_problem_set(path)
            except TaskError:
                continue
            if any(_task_dir_of(pset, problem) == task_dir for problem in pset.problems):
                return pset.path.parent
    return task_dir.parent


def _task_dir_of(pset: ProblemSet, problem: Problem) -> Path | None:
    try:
        return pset.task_dir(problem)
    except (OSError, ValueError, TaskError):  # a NUL in the directory, a loop of links, a folder outside the set
        return None


def load_problem_set(path: Path | str) -> ProblemSet:
    """Load a problem-set yaml (`name`, `deadline`, `description`, `problems: [...]`)."""
    path = Path(path)
    raw = read_yaml(path, "problem set")
    check = _Checker(path)
    if not isinstance(raw, Mapping) or "problems" not in raw:
        raise check.fail("not a problem set (no `problems` key)")
    problems_raw = raw["problems"]
    check.expect(isinstance(problems_raw, list), "problems", "a list", problems_raw)
    problems = []
    for i, entry in enumerate(problems_raw):
        check.expect(isinstance(entry, Mapping), f"problems[{i}]", "a mapping", entry)
        for k in ("directory", "name"):
            check.expect(isinstance(entry.get(k), str) and entry.get(k), f"problems[{i}].{k}", "a string", entry.get(k))
            check.text(f"problems[{i}].{k}", entry[k])
        gpus = entry.get("gpus") or []
        check.expect(isinstance(gpus, list), f"problems[{i}].gpus", "a list", gpus)
        deadline = entry.get("deadline")
        problems.append(Problem(entry["directory"], entry["name"], str(deadline) if deadline else None,
                                tuple(str(g) for g in gpus), index=i))
    deadline = raw.get("deadline")
    return ProblemSet(path=path.resolve(), name=str(raw.get("name") or path.stem), problems=tuple(problems),
                      description=str(raw.get("description") or ""), deadline=str(deadline) if deadline else None)


# ---------------------------------------------------------------------------------------- finding


def bundled_problem_set() -> ProblemSet:
    """popkit's own problem set, read once per version of its file (resolving a name read it twice a run)."""
    path = data_dir("tasks") / "problems.yaml"
    try:
        stat = path.stat()
        version = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        version = None
    return _bundled_set(path, version)


@functools.lru_cache(maxsize=4)
def _bundled_set(path: Path, version: tuple[int, int] | None) -> ProblemSet:
    return load_problem_set(path)


def task_roots(explicit: Iterable[Path | str] = ()) -> list[Path]:
    """Roots to search for problem sets: `--tasks-root` values, then POPKIT_TASKS_PATH entries."""
    roots = [Path(p).expanduser() for p in explicit]
    env = os.environ.get("POPKIT_TASKS_PATH", "")
    roots += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    for root in roots:
        if not root.exists():
            raise TaskError(f"{root}: tasks root does not exist", "check --tasks-root / POPKIT_TASKS_PATH")
    return roots


def _problem_set_files(root: Path, max_depth: int = 3) -> list[Path]:
    if root.is_file():
        return [root]
    found = []
    for pattern in ("*.yaml", "*.yml"):
        for path in root.rglob(pattern):
            rel_depth = len(path.relative_to(root).parts)
            if rel_depth <= max_depth and path.name not in ("task.yml", "task.yaml"):
                found.append(path)
    return sorted(found)


@dataclass(frozen=True)
class Skipped:
    """A problem set, or one entry of it, that `popkit tasks` could not load: the rest still lists."""

    problem_set: Path
    leaderboard: str | None  # None: the whole set
    error: TaskError

    def to_json(self) -> dict:
        return {"problem_set": str(self.problem_set), "leaderboard": self.leaderboard,
                "error": self.error.message, "hint": self.error.hint}


def problem_sets(roots: Sequence[Path], skipped: list[Skipped] | None = None) -> list[ProblemSet]:
    """Every problem set under `roots` (yaml files with a `problems` key); other yaml files are ignored.

    With a `skipped` list, a set that does not load goes there instead of raising.
    """
    sets = []
    for root in roots:
        for path in _problem_set_files(root):
            try:
                raw = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
                continue
            if isinstance(raw, Mapping) and "problems" in raw:
                try:
                    sets.append(load_problem_set(path))
                except TaskError as exc:
                    if skipped is None:
                        raise
                    skipped.append(Skipped(path, None, exc))
    return sets


def _from_problem(pset: ProblemSet, problem: Problem, bundled: bool = False) -> Task:
    task = load_task(pset.task_dir(problem), leaderboard=problem.name, gpus=problem.gpus, bundled=bundled,
                     set_root=pset.path.parent.resolve())
    return replace(task, deadline=problem.deadline or pset.deadline)


def resolve_task(spec: str, roots: Sequence[Path] = ()) -> Task:
    """Find a task by directory path, leaderboard name (bundled first, then user roots) or directory name.

    A bundled name wins over a problem set under `roots` that names the same leaderboard, so the
    quick start's files keep running their own task; `shadowed_tasks` says when that happens, and the
    set's task is still reachable by its directory.
    """
    as_path = Path(spec).expanduser()
    if as_path.is_dir() or as_path.name in ("task.yml", "task.yaml"):
        return load_task(as_path)
    bundled = bundled_problem_set()
    for problem in bundled.problems:
        if problem.name == spec:
            return _from_problem(bundled, problem, bundled=True)
    skipped: list[Skipped] = []  # a broken set elsewhere under the roots hides no other set's names
    user = [(ps, p) for ps in problem_sets(roots, skipped) for p in ps.problems]
    hits = [(ps, p) for ps, p in user if p.name == spec]
    if len(hits) > 1:
        where = ", ".join(str(ps.path) for ps, _ in hits)
        raise TaskError(f"leaderboard `{spec}` is named by several problem sets: {where}",
                        "pass the task directory with --task instead")
    if hits:
        return _from_problem(*hits[0])
    for root in roots:  # a task directory directly under a root, by its directory name
        if (root / spec / "task.yml").is_file():
            return load_task(root / spec)
    names = sorted({p.name for _, p in user} | {p.name for p in bundled.problems})
    close = difflib.get_close_matches(spec, names, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "`popkit tasks` lists the tasks popkit knows"
    if skipped:
        hint += f"; {len(skipped)} problem set(s) did not load, e.g. {skipped[0].error.message}"
    raise TaskError(f"no task named `{spec}` (not a directory, nor a leaderboard name)", hint)


def shadowed_tasks(spec: str, roots: Sequence[Path] = ()) -> list[Path]:
    """Task directories under `roots` whose leaderboard name `spec` a bundled task of that name hides."""
    if Path(spec).expanduser().is_dir() or not any(p.name == spec for p in bundled_problem_set().problems):
        return []
    found = [_task_dir_of(ps, p) for ps in problem_sets(roots, []) for p in ps.problems if p.name == spec]
    return [d for d in found if d is not None]


def list_tasks(roots: Sequence[Path] = (), skipped: list[Skipped] | None = None) -> list[Task]:
    """Bundled tasks, then every task named by a problem set under `roots`.

    With a `skipped` list, a set or entry under `roots` that does not load goes there instead of raising.
    """
    tasks = []
    bundled = bundled_problem_set()
    for problem in bundled.problems:
        tasks.append(_from_problem(bundled, problem, bundled=True))
    for pset in problem_sets(roots, skipped):
        for problem in pset.problems:
            try:
                tasks.append(_from_problem(pset, problem))
            except TaskError as exc:
                if skipped is None:
                    raise
                skipped.append(Skipped(pset.path, problem.name, exc))
    return tasks


def scale_world_size(task: Task, world_size: int) -> Task:
    """The task with every case's `world_size` replaced by `world_size` (a scaled-down run, not the leaderboard's)."""
    if not any("world_size" in c for c in task.tests + task.benchmarks):
        raise UsageError(f"{task.display_name}: no `world_size` in its cases, nothing to scale",
                         "--world-size applies to multi-GPU tasks")
    if world_size < 1:
        raise UsageError(f"--world-size {world_size}: must be at least 1", "e.g. --world-size 2")

    def scaled(cases):
        return tuple({k: (world_size if k == "world_size" else v) for k, v in c.items()} for c in cases)

    return replace(task, tests=scaled(task.tests), benchmarks=scaled(task.benchmarks))
