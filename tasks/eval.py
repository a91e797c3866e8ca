"""popkit's harness: runs one mode of a GPU MODE task the way the leaderboard's runner does.

Usage (as the runner calls it, in a working directory holding reference.py, task.py, utils.py and
submission.py side by side):

    POPCORN_FD=<write end of a pipe> [POPCORN_SEED=<secret seed>] python eval.py MODE CASES_FILE

MODE is test, benchmark, leaderboard or profile. CASES_FILE has one case per line, `key: value`
pairs joined by "; " (values are Python literals: ints, floats, True/False, lists; anything else
is kept as a string).

Exit codes: 0 every case passed; 2 bad usage or unknown mode; 110 CUDA API failure; 111 no
usable POPCORN_FD; 112 ran, but a check failed; 113 bad or unreadable cases file.

Environment:
    POPCORN_FD    write end of the result pipe (required). It is kept non-inheritable and removed
                  from the environment; the submission never sees it.
    POPCORN_SEED  secret seed (optional). Read, then removed before the submission is imported;
                  each case seed `a` becomes a + (a+b)(a+b+1)//2 for secret seed `b`.
    POPKIT_TRUST  "0" turns popkit's trust checks off (fidelity runs: only what the leaderboard's
                  own eval does). Any other value, or unset, leaves them on. Removed from the
                  environment before the submission is imported.
    POPKIT_KEY_FD set by popkit: a descriptor holding the key of the closing record `popkit.end: HMAC`
                  (see ResultPipe). The key is read and the descriptor closed before anything else
                  starts, so the key is in no environment, command line or open file of the worker.
    POPKIT_TIMING_AUDIT  a measurement switch (scripts/gpu_timing_study.py): which rule judges work left
                  running after the end event. `trace` (default): GPU timestamps of every timed call
                  (TraceAudit); `drain`: the host-clock share rule (unsynchronized_work); `off`: none.
                  Removed from the environment before the submission is imported; an unknown value exits 2.
    POPKIT_WORKER_SPIN  a measurement switch (scripts/gpu_split_cost.py): "1" makes the worker on a GPU poll
                  for its next request instead of sleeping until it comes (popkit_worker SPIN_S). Removed
                  from the environment before the submission is imported.
    POPKIT_CONTROL_FD  set by `popkit test --watch` instead of POPKIT_KEY_FD: a warm start (warm_main).
                  The parent and its worker do everything that does not need the submission (torch,
                  the device, the reference, the L2 flush buffer, the inputs of CASES_FILE's cases),
                  write `popkit.warm: ready` on the pipe, then wait for one line on this descriptor:
                  `go {"mode": MODE, "cases": CASES_FILE_TEXT, "key": KEY}`. Only then is the submission
                  imported, and the mode runs exactly as a cold start runs it (the same Session, the same
                  pipe lines, the key's closing record); both processes then exit. End of file instead of
                  `go`: exit 0, nothing written. The descriptor is non-inheritable; the worker never has it.

Pipe keys: test-count, test.I.spec|status|error|message; benchmark-count,
benchmark.I.spec|runs|mean|std|err|best|worst (nanoseconds), benchmark.I.status: fail with
benchmark.I.error, benchmark.I.report (profile mode: base64 of a torch profiler table), check.
popkit's extra keys: benchmark.I.median (ns), benchmark.I.samples (every timed call, ns, comma
separated), benchmark.I.stop (converged, max_time, wall_time, max_repeats), benchmark.I.timer
(cuda-event, cpu-monotonic), benchmark.I.message (details of a failure, as test.I.message),
benchmark.I.status: pass (profile mode, which has no statistics), benchmark.I.bytes (trust checks on:
the fewest bytes one call must move, inputs read once and outputs written once),
benchmark.I.drain_median|drain_max|drains (GPU: ns the device stayed busy after a timed call's end event,
by the host clock), benchmark.I.overruns|marker_overruns (trace audit: per timed call, ns its GPU work ended
after its end event; nan without GPU work), benchmark.I.kernel_ns|gap_ns|launches (trace audit, per timed call:
GPU time its own work kept a queue busy, idle time inside its span, its activities; the worker's trace),
benchmark.I.late_starts (calls judged against the end marker
alone), benchmark.I.audit_samples (event times of a case the timing audit failed), system.device|torch|cuda|
hip|arch, system.copy_bandwidth (the CPU, timed modes, trust on: bytes/s of the trusted side's best copy,
the CPU's physics floor), trust.checks, trust.audit (the timing audit that judged: trace, drain, off) and
trust.audit_note; phase.judge_ns|ready_ns|cases_ns|close_ns (where the eval's time went, by this process's clock:
its own start, the worker's start until `ready` with the submission's import, the cases, the worker's exit).
Newlines in values are written as the two characters `\\n`.

Process layout (docs/sealed-run.md): this process, the trusted side, holds the pipe, imports the task's
reference (never the submission), decides the device, the timer, the audit rule and the cases, judges every
output (Judge) and computes every statistic. The submission runs in ONE worker started with the
multiprocessing "spawn" method; it lives for the whole invocation, never receives the pipe, and sends back
JSON only (never pickle, so nothing it sends can run code here) plus its outputs' bytes in a memfd this
process made (Exporter). With trust off the worker's verdicts stand, as in the leaderboard's own eval.

Code layout (docs/design.md, "The harness"): this file is only the entry; the harness is eight modules in its
folder, copied with it into the eval's folder and loaded from there by their paths (load), each by the side that
runs it. Shared (pure or the task's own code, run by each process on its own objects): popkit_protocol (the
cases file, constants, statistics, the drain and trace-audit rules), popkit_shared (the device, the task's
reference and inputs, tensor helpers), popkit_seal (non-dumpable, the death signal, the seccomp filter). The
trusted side: popkit_trusted (ResultPipe, WorkerLink, Session, main) and popkit_judge (Judge, forged_time). The
worker side: popkit_worker (Worker and its request loop), popkit_calls (Guards, Caller, Checker, Exporter) and
popkit_timed (TraceAudit, TimedCase). The trusted process never imports a worker-side module and the worker
never imports a trusted-side one (tests/test_harness_split.py).

Trust checks (on unless POPKIT_TRUST=0; each failure names its class in the case's error):
    clone-inputs          the kernel gets clones; the reference and the check use the pristine copy
    output-buffer-poison  buffers in data that the reference writes and returns (e.g. identity's
                          `output`) are filled with 0xFF bytes (NaN for floats) before each call
    freed-memory-poison   blocks of the output's byte size are allocated, filled, freed before calls
    double-run            two checked calls per case, with different poison bytes
    fresh-seed            one more checked call on a never-seen input (case seed + 7; the warm-up
                          uses seed + 1009, so no input a timed call gets was seen before)
    input-mutation        inputs compared bit for bit with their pristine copies after the call
    output-aliasing       an output may share storage only with the inputs the reference's
                          corresponding output shares (output buffers, views the reference returns)
    output-type           plain torch.Tensor (or the reference's type), no instance overrides
    recheck-timed         leaderboard: fresh input and a full check for every timed call (every second
                          one written into the previous call's tensors, so a cache keyed on
                          addresses always replays and is named);
                          benchmark: the last timed call's output is checked too (not for tasks
                          with in/out buffers, whose data every timed call changes)
    benchmark-shapes      every benchmark case is checked before it is timed
    tripwires             timers, synchronize, events, comparison functions and the reference's
                          functions are captured before the submission is imported, verified after
                          the import and after every call; timing uses the captured ones
    threads               a thread started during the call (or the import) that is still alive and
                          runs the submission's code fails it; library thread pools (torch.compile)
                          are not the submission's code
    device-sync           the device is synchronized before any verdict is read
    unsynchronized-work   GPU: every timed call is traced (torch's profiler, GPU activities only) between
                          the harness's marker kernels; a case fails when any call's work on any queue
                          ended more than 10 µs after its end event (GPU timestamps: no host stall counts).
                          Where the trace's self-test fails, the drain rule instead: a device-wide
                          synchronize timed after each end event, failing at least max(3, half) of the
                          calls over 50 µs
    mode-probe            a check failing outside test mode is retried with sys.argv saying test
    pipe-guard            the result fd is non-inheritable and this process is made non-dumpable,
                          so /proc/<pid>/fd cannot reopen it (ineffective when running as root);
                          foreign bytes on the worker channel fail the run
    trusted-verdict       every checked and rechecked output is judged in this process, on its own inputs
                          (Judge); a worker that hands over no output fails with `no output`
    time-witness          this process's clock around every timed call; a reported median far below it
                          (forged_time) fails with `time forged`
    worker-seal           the worker runs under a seccomp filter refusing ptrace and process_vm_readv/writev,
                          without CAP_SYS_PTRACE (seal_worker)

What this cannot stop (docs/sealed-run.md): Python or native code in the worker can rewrite the worker's side
of the harness (its checks are defence in depth; the verdict is this process's), and lower its reported
times within forged_time's tolerance and above the physics floor; a process running as root can reopen the
pipe; grandchild processes that detach from the process group outlive the check.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = ("popkit_protocol", "popkit_seal", "popkit_shared")  # each after the modules it imports
TRUSTED = (*SHARED, "popkit_judge", "popkit_trusted")
WORKER = (*SHARED, "popkit_calls", "popkit_timed", "popkit_worker")


def load(names: tuple[str, ...]):
    """The named harness modules, each from this file's folder by its path, in order; returns the last. The import
    path is never searched, so no module of the same name elsewhere (a submission's file, a planted one) is
    imported in a module's place, and the modules find each other in sys.modules."""
    import importlib.util

    for name in names:
        path = os.path.join(HERE, name + ".py")
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None) == path:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while a class is built
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[names[-1]]


def worker_entry(conn, settings: dict) -> None:
    """The spawned worker's first function: multiprocessing finds it as `__main__.worker_entry` in this file, run
    again there as `__mp_main__` (which loads nothing). It loads the worker side's modules only."""
    load(WORKER).worker_main(conn, settings)


if __name__ == "__main__":
    try:
        trusted = load(TRUSTED)
    except OSError as exc:
        print(f"eval: popkit's harness is incomplete ({exc.strerror}: {exc.filename}); its modules belong beside "
              "eval.py", file=sys.stderr)
        sys.exit(2)
    sys.exit(trusted.main(worker_entry))
