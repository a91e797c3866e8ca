"""popkit's one error tree and its documented exit codes.

The library raises PopkitError subclasses; only the CLI turns them into a message and an exit
code. A message names the file, key or line; a hint says what to do about it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of the `popkit` command (documented in README.md's exit-code table)."""

    OK = 0
    FAILED = 1  # ran, but a check failed (wrong output, reward hack caught, lint errors, slower in A/B gate)
    USAGE = 2  # bad command line
    BAD_TASK = 3  # task.yml or problem set invalid, task not found, the task's reference failed
    BAD_SUBMISSION = 4  # submission missing, unreadable, syntax error, an entry point the task's eval takes is missing
    COMPILE_FAILED = 5  # the kernel did not build
    CRASHED = 6  # the eval process died (signal, CUDA error, non-protocol exit code)
    TIMED_OUT = 7  # a mode ran past its timeout
    REFUSED = 8  # the leaderboard server would refuse the file (popkit check errors)
    POPCORN = 9  # popcorn-cli missing, not registered, rate-limited, or the remote run failed
    HISTORY = 10  # the run history database is unreadable or locked
    ENVIRONMENT = 11  # the local environment cannot do what was asked (no torch, no nvcc, doctor problems)
    INTERNAL = 70  # a bug in popkit
    HANGUP = 129  # stopped by SIGHUP (128 + signal number, as shells report it)
    INTERRUPTED = 130  # stopped by SIGINT (Ctrl-C)
    TERMINATED = 143  # stopped by SIGTERM


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: popkit unwinds (children killed, working files removed), then exits."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class PopkitError(Exception):
    """An error the user can act on: one-line message plus a hint."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, hint: str = "", *, exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def to_json(self) -> dict:
        return {
            "error": type(self).__name__,
            "message": self.message,
            "hint": self.hint,
            "exit_code": int(self.exit_code),
        }


class UsageError(PopkitError):
    exit_code = ExitCode.USAGE


class TaskError(PopkitError):
    exit_code = ExitCode.BAD_TASK


class SubmissionError(PopkitError):
    exit_code = ExitCode.BAD_SUBMISSION


class CompileError(PopkitError):
    exit_code = ExitCode.COMPILE_FAILED


class RefusedError(PopkitError):
    exit_code = ExitCode.REFUSED


class PopcornError(PopkitError):
    exit_code = ExitCode.POPCORN


class HistoryError(PopkitError):
    exit_code = ExitCode.HISTORY


class EnvironmentProblem(PopkitError):
    exit_code = ExitCode.ENVIRONMENT
