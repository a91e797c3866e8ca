"""The sandbox's root shows the compilers a build calls, wherever they are installed (a GPU machine's
/opt/gcc/bin/gcc, named by CC and handed to nvcc as -ccbin, was missing and every CUDA build failed)."""

from __future__ import annotations

import os
import sys

from popkit.run import sandbox


def _tool(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_a_compiler_named_by_cc_is_shown_with_its_installation(tmp_path):
    gcc = _tool(tmp_path / "opt" / "gcc" / "bin", "gcc")
    env = {"CC": str(gcc), "PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home")}
    assert str(tmp_path / "opt" / "gcc") in sandbox.compiler_prefixes(env)
    assert str(tmp_path / "opt" / "gcc") in sandbox.sandbox_paths(sys.executable, env)["visible"]


def test_a_compiler_found_on_path_is_shown_and_one_in_home_is_not(tmp_path):
    home = tmp_path / "home"
    _tool(tmp_path / "tools" / "bin", "nvcc")
    _tool(home / "bin", "clang")
    env = {"PATH": f"{tmp_path / 'tools' / 'bin'}{os.pathsep}{home / 'bin'}", "HOME": str(home)}
    visible = sandbox.sandbox_paths(sys.executable, env)["visible"]
    assert str(tmp_path / "tools") in visible
    assert not any(p == str(home) or p.startswith(str(home) + os.sep) for p in visible)
