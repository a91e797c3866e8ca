"""The first hour's inner loop: `popkit watch FILE` is `popkit test FILE --watch` by its own name."""

from __future__ import annotations

from pathlib import Path

import typer

GOOD = Path(__file__).parent.parent / "submissions" / "vectoradd" / "pytorch.py"


def test_watch_is_test_watch_by_its_own_name(cli, monkeypatch):
    seen = []

    def fake_watch(request, json):
        seen.append((request.mode, [str(s.path) for s in request.sources], json))
        raise typer.Exit(0)

    monkeypatch.setattr("popkit.cli.running._watch", fake_watch)
    result = cli("watch", str(GOOD), "--json")
    assert result.exit_code == 0, result.output
    assert seen == [("test", [str(GOOD)], True)]
    result = cli("watch", "no-such-file.py")
    assert result.exit_code == 4 and "no-such-file.py" in result.output
