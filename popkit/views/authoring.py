"""Output of new, templates, compile and doctor: Rich for people, one JSON document for agents."""

from __future__ import annotations



from popkit.operations.doctor import DoctorReport
from popkit.operations.timingcheck import TimingReport
from popkit.run.compile import CompileReport
from popkit.views.common import console, emit_json, escape, table as common_table
from popkit.views.running import gpu_state_line

LOG_TAIL_LINES = 20  # lines of a failed build's log shown when no diagnostic explains it
_STATUS = {"ok": "[green]ok[/]", "info": "[cyan]info[/]", "warn": "[yellow]warn[/]", "problem": "[bold red]problem[/]"}
_SEVERITY = {"error": "[bold red]error[/]", "warning": "[yellow]warning[/]", "note": "[cyan]note[/]"}


def show_written(written, json: bool) -> None:
    if json:
        emit_json("new", written.to_json())
        return
    r, con = written.rendered, console()
    what = f"{r.task} · {r.target.upper()} · {r.style} · {r.gpu}" + (f" · {r.arch}" if r.arch else "")
    replaced = " (replaced the existing file)" if written.overwrote else ""
    con.print(f"[green]wrote[/] {escape(str(written.path))}{replaced}  [dim]{escape(what)}, from {escape(r.spec)}[/]")
    if r.skeleton:
        con.print("[yellow]skeleton:[/] the task has no kernel.yml; the file compiles but its kernel only copies "
                  "the first input. Fill in what its comments say.")
    con.print(f"next: popkit compile {escape(str(written.path))}   then   popkit test {escape(str(written.path))}")
    if written.warning:
        con.print(f"[yellow]warning:[/] {escape(written.warning)}")


def show_catalog(catalog, json: bool) -> None:
    if json:
        emit_json("templates", catalog.to_json())
        return
    con = console()
    con.print("[bold]targets and styles[/] (default style: inline)")
    for target, styles in catalog.targets:
        con.print(f"  {target}: {', '.join(styles)}")
    table = common_table(("task", "leaderboard", "spec", "geometry"), title="tasks", title_justify="left",
                         show_edge=False, pad_edge=False, box=None)
    for info in catalog.tasks:
        if info.error:
            spec = f"[red]invalid:[/] {escape(info.error)}"
        else:
            spec = "kernel.yml" if info.spec else "[dim]none: skeleton[/]"
        table.add_row(escape(info.task), escape(info.leaderboard), spec, escape(info.geometry or "-"))
    con.print(table)
    con.print("render one: popkit new --task NAME --target cuda|hip --style inline|library -o FILE")


def show_compile(report: CompileReport, json: bool) -> None:
    if json:
        emit_json("compile", report.to_json())
        return
    con = console()
    errors, warnings = len(report.errors), len(report.warnings)
    counts = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    where = f" with TORCH_CUDA_ARCH_LIST={report.arch_list}" if report.arch_list else ""
    if report.status == "built":
        con.print(f"[green]built[/] {escape(report.submission)} ({report.target}{escape(where)})"
                  + (f"  [dim]{counts}[/]" if warnings else ""))
    elif report.status == "device-built":
        con.print(f"[green]built for {escape(report.arch or '')}[/] {escape(report.submission)} (the HIP kernels, "
                  f"with {escape(report.compiler or 'clang')})" + (f"  [dim]{counts}[/]" if warnings else ""))
    elif report.status == "static-only":
        verdict = "[green]static checks passed[/]" if report.ok else "[bold red]static checks failed[/]"
        con.print(f"{verdict} {escape(report.submission)} ({report.target}, not built)  [dim]{counts}[/]")
    elif report.status == "bad-submission":
        con.print(f"[bold red]import failed[/] {escape(report.submission)}: the module raised before or "
                  "outside the build")
    else:
        con.print(f"[bold red]build failed[/] {escape(report.submission)} ({report.target}{escape(where)}): {counts}")
    if report.kernels:
        _kernel_table(con, report.kernels)
    if report.cold_s is not None and report.status != "static-only":
        cached = " (cached)" if report.cached else ""
        label = "device build" if report.arch else "cold build  "
        con.print(f"  {label} {report.cold_s:7.1f} s{cached}")
    if report.warm_s is not None:
        con.print(f"  warm import  {report.warm_s:7.1f} s")
    if report.torch_import_s is not None:
        con.print(f"  torch import {report.torch_import_s:7.1f} s  [dim](not counted above)[/]")
    if report.build_dir:
        con.print(f"  build folder {escape(report.build_dir)}")
    for d in report.diagnostics:
        _diagnostic(con, d)
    for note in report.notes:
        label = "" if note.startswith("warning:") else "note: "
        con.print(f"[yellow]{escape(label + note)}[/]" if label == "" else f"[dim]{escape(label + note)}[/]")
    if not report.ok and not report.diagnostics and report.log:
        lines = report.log.rstrip().splitlines()
        con.print(f"[dim]last {min(len(lines), LOG_TAIL_LINES)} lines of the build log (--json has all of it):[/]")
        con.print(escape("\n".join(lines[-LOG_TAIL_LINES:])))


def _kernel_table(con, kernels) -> None:
    """Per kernel of a HIP device build: registers per lane, LDS bytes per block, scratch bytes per lane,
    spilled registers, waves per SIMD."""
    names = ("kernel", "line", "VGPR", "AGPR", "SGPR", "LDS", "scratch", "spill", "waves")
    table = common_table(names, right=names[1:], no_wrap=names[1:], show_edge=False, pad_edge=False, box=None,
                         padding=(0, 1, 0, 0))
    for k in kernels:
        spills = k.get("vgpr_spills", 0) + k.get("sgpr_spills", 0)
        table.add_row(escape(k["name"]), str(k.get("line") or ""), str(k["vgprs"]), str(k["agprs"]), str(k["sgprs"]),
                      str(k["lds_bytes"]), str(k["scratch_bytes"]), f"[red]{spills}[/]" if spills else "0",
                      str(k.get("occupancy") or ""))
    con.print(table)


def _diagnostic(con, d) -> None:
    con.print(f"{escape(d.location)}: {_SEVERITY.get(d.severity, d.severity)}: {escape(d.message)} "
              f"[dim]\\[{d.tool}]" + (f" (from {escape(d.generated)})" if d.generated else "") + "[/]")
    if d.source_line:
        number = str(d.line) if d.line else ""
        con.print(f"  {number:>5} | {escape(d.source_line.rstrip())}", soft_wrap=True)
        if d.column:
            con.print(f"  {'':>5} | {' ' * (d.column - 1)}[bold]^[/]")
    if d.hint:
        con.print(f"  [dim]hint:[/] {escape(d.hint)}")


def show_doctor(report: DoctorReport, json: bool) -> None:
    if json:
        emit_json("doctor", report.to_json())
        return
    con = console()
    table = common_table(("status", "check", "value"), show_header=False, show_edge=False, pad_edge=False, box=None)
    for c in report.checks:
        table.add_row(_STATUS.get(c.status, c.status), escape(c.name), escape(c.value))
    con.print(table)
    fixes = [c for c in report.checks if c.fix and c.status in ("problem", "warn", "info")]
    for c in fixes:
        con.print(f"{_STATUS[c.status]} {escape(c.name)}: {escape(c.fix)}")
    con.print(doctor_summary(report))


def doctor_summary(report: DoctorReport) -> str:
    """The closing line: problems block (exit 11); warnings name what will not work here (exit 0)."""
    problems, warnings = len(report.problems), report.warnings
    said = [f"[bold red]{problems} problem{'s' * (problems != 1)}[/]"] if problems else []
    if warnings:
        names = ", ".join(escape(c.name) for c in warnings)
        said.append(f"[yellow]{len(warnings)} warning{'s' * (len(warnings) != 1)}[/] ({names}: see above)")
    return ", ".join(said) if said else "[green]no problems[/]"


def _rate(bytes_per_s: float | None) -> str:
    return f"{bytes_per_s / 1e9:,.1f} GB/s" if bytes_per_s else "-"


def timing_rows(report: TimingReport) -> list[tuple[str, str]]:
    """`doctor --timing`'s measurements as (name, value) rows, CPU first."""
    cpu, gpu = report.cpu, report.gpu
    rows = []
    if cpu:
        rows += [("CPU timer", f"resolution {cpu['timer_resolution_ns']} ns, {cpu['timer_call_ns']:.0f} ns a call"),
                 ("CPU memory copy", f"{_rate(cpu['copy_bandwidth_bytes_per_s'])} (read + write, "
                                     f"{cpu['copy_bytes'] >> 20} MiB)")]
    if gpu.get("error"):
        rows.append(("GPU", f"not measured: {gpu['error']}"))
    elif gpu:
        rows += [("GPU", f"{gpu['device']} · torch {gpu['torch']}"),
                 ("launch floor", f"{gpu['launch_floor_us']:.2f} µs: a one-element kernel between CUDA events"),
                 ("event pair", f"{gpu['event_pair_us']:.2f} µs: two CUDA events, nothing between"),
                 ("back-to-back launches", f"{gpu['back_to_back_launch_us']:.2f} µs a kernel"),
                 ("GPU memory copy", f"{_rate(gpu['copy_bandwidth_bytes_per_s'])} (read + write, "
                                     f"{gpu['copy_bytes'] >> 20} MiB)")]
    if report.gpu_state:
        rows.append(("clocks", gpu_state_line(report.gpu_state)))
    return rows


def show_timing(report: TimingReport, json: bool) -> None:
    if json:
        emit_json("timing", report.to_json())
        return
    con = console()
    if report.error:
        con.print(f"[bold red]timing not measured:[/] {escape(report.error)}")
        return
    table = common_table(("measured", "value"), show_header=False, show_edge=False, pad_edge=False, box=None)
    for name, value in timing_rows(report):
        table.add_row(escape(name), escape(value))
    con.print(table)
    con.print(f"[dim]{escape(report.python)} · {report.duration_s:.1f} s · medians over repeats (docs/timing.md)[/]")
