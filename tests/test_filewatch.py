"""Saves of one file noticed by stat polling and debounced (popkit/operations/filewatch.py), on a scripted file and a
fake clock: no real file, no sleeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from popkit.operations.filewatch import SaveWatcher, Stamp

HONEST = b'import torch\n\n\ndef custom_kernel(data):\n    return data["x"] * data["scale"]\n'
EDITED = b'import torch\n\n\ndef custom_kernel(data):\n    return (data["x"] * data["scale"]).clone()  # v2\n'


class ScriptedFile:
    """A file whose contents change at given (fake) times; `rename` saves give it a new inode."""

    def __init__(self, events: list[tuple[float, bytes | None, int]]):
        self.events = events  # (time, content or None for missing, inode)
        self.now = 0.0
        self.reads = 0

    def current(self):
        past = [e for e in self.events if e[0] <= self.now]
        return past[-1] if past else None

    def stat(self, _path):
        event = self.current()
        if event is None or event[1] is None:
            return None
        return Stamp(int((1000.0 + event[0]) * 1e9), len(event[1]), event[2])  # on the fake wall clock

    def read(self, _path):
        self.reads += 1
        event = self.current()
        if event is None or event[1] is None:
            raise FileNotFoundError(_path)
        return event[1]

    def sleep(self, seconds):
        self.now += seconds

    def watcher(self, **kw):
        return SaveWatcher(Path("f.py"), poll_s=0.05, settle_s=0.5, clock=lambda: self.now,
                           wall=lambda: 1000.0 + self.now, sleep=self.sleep, stat=self.stat, read=self.read, **kw)


def test_a_save_is_taken_once_it_stayed_put_for_a_poll_and_parses():
    f = ScriptedFile([(0.0, HONEST, 1), (1.00, b"import torch\n\ndef custom_kernel(data):\n", 1),
                      (1.12, EDITED, 1)])
    w = f.watcher()
    save = w.next_save()
    assert save.content == EDITED and save.parses  # the half file (it does not parse) was never taken
    assert 1.12 <= f.now <= 1.12 + 2 * 0.05 + 1e-9  # stable for one poll after the last write
    assert save.noticed_at == pytest.approx(1.0, abs=0.051)
    assert save.saved_at == pytest.approx(1001.12)  # the modification time of the save itself


def test_a_writer_still_appending_is_waited_for():
    steps = [(1.0 + 0.03 * i, HONEST + b"#" * i, 1) for i in range(10)]  # a new size every 30 ms
    f = ScriptedFile([(0.0, HONEST, 1)] + steps)
    save = f.watcher().next_save()
    assert save.content == HONEST + b"#" * 9


def test_an_unparsable_file_that_settles_is_a_syntax_error_save():
    f = ScriptedFile([(0.0, HONEST, 1), (1.0, b"def custom_kernel(data:\n", 1)])
    save = f.watcher().next_save()
    assert not save.parses and save.content == b"def custom_kernel(data:\n"
    assert f.now == pytest.approx(1.5, abs=0.11)  # settle_s after its last change


def test_an_editor_that_unlinks_and_renames_gives_one_save():
    f = ScriptedFile([(0.0, HONEST, 1), (1.0, None, 1), (1.2, EDITED, 2)])
    save = f.watcher().next_save()
    assert save.content == EDITED and save.stamp.inode == 2


def test_nothing_changes_until_stop_and_a_touch_is_a_save():
    f = ScriptedFile([(0.0, HONEST, 1), (5.0, HONEST, 1)])  # the same bytes, a new modification time
    w = f.watcher()
    assert w.next_save(stop=lambda: f.now >= 2.0) is None
    assert f.reads == 0  # an unchanged file is only stat'ed
    ticks = []
    assert w.next_save(tick=lambda: ticks.append(f.now)).content == HONEST
    assert len(ticks) > 10


def test_a_save_made_while_the_caller_was_away_counts_from_its_own_time():
    f = ScriptedFile([(0.0, HONEST, 1), (3.0, EDITED, 1)])
    w = f.watcher()
    f.now = 4.0  # the caller was busy (a verdict) when the file was saved
    save = w.next_save()
    assert save.saved_at == pytest.approx(1003.0)
