"""One run per device at a time, for the MCP server: calls that run kernels queue for the devices they use.

A device is a GPU index, or the CPU on a machine without a GPU (a timing taken beside another run is not
a timing either way). A call holds every device it names for its whole run; calls are served in the order
they asked, so a call that needs every GPU is not passed over forever by calls that need one. While a call
waits it says for what and behind whom, at once and then every WAIT_NOTE_EVERY_S seconds (the server turns
that into MCP progress). Plain asyncio: the server runs under anyio's asyncio back end. asyncio is imported where
it is used: every other command of the CLI imports this module too, and asyncio costs tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Sequence

from popkit.machine import system

WAIT_NOTE_EVERY_S = 5.0

Say = Callable[[str], Awaitable[None]]


@dataclass(eq=False)
class _Ticket:
    wanted: frozenset[str]
    who: str
    since: float = field(default_factory=time.monotonic)


def machine_devices() -> tuple[str, ...]:
    """The devices of this machine: GPU indices `0`..`n-1`, `gpu` where the count is unknown, else `cpu`."""
    count = system.gpu_count()
    if count is None:
        return ("gpu",)
    return tuple(str(i) for i in range(count)) or ("cpu",)


def label(device: str) -> str:
    return {"cpu": "the CPU", "gpu": "the GPUs"}.get(device, f"GPU {device}")


class Slots:
    """The devices and who holds each; `hold(wanted, who, say)` waits its turn, then holds them for the block."""

    def __init__(self, devices: Sequence[str]):
        self.devices = tuple(devices)
        self.holders: dict[str, _Ticket] = {}
        self.queue: list[_Ticket] = []
        import asyncio

        self._changed = asyncio.Event()

    def wanted(self, gpus: Sequence[str] | None) -> tuple[str, ...]:
        """What a run holds: the GPUs it is pinned to, else every device."""
        return tuple(str(g) for g in gpus) if gpus else self.devices

    def _ahead(self, ticket: _Ticket) -> list[_Ticket]:
        """Holders of a device the ticket wants, and earlier waiters for one."""
        holding = [self.holders[d] for d in sorted(ticket.wanted) if d in self.holders]
        waiting = [t for t in self.queue[:self.queue.index(ticket)] if t.wanted & ticket.wanted]
        return list(dict.fromkeys(holding + waiting))

    def _waiting_note(self, ticket: _Ticket) -> str:
        now = time.monotonic()
        parts = []
        for other in self._ahead(ticket):
            held = [label(d) for d in sorted(other.wanted) if self.holders.get(d) is other]
            if held:
                parts.append(f"{other.who} has held {', '.join(held)} for {now - other.since:.0f} s")
            else:
                parts.append(f"{other.who} is ahead in line")
        devices = ", ".join(label(d) for d in sorted(ticket.wanted))
        return f"waiting for {devices} ({now - ticket.since:.0f} s): " + "; ".join(parts)

    def _notify(self) -> None:
        import asyncio

        self._changed.set()
        self._changed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def hold(self, wanted: Sequence[str], who: str, say: Say) -> AsyncIterator[None]:
        if not wanted:
            yield
            return
        import asyncio

        ticket = _Ticket(frozenset(wanted), who)
        self.queue.append(ticket)
        said = None
        try:
            while self._ahead(ticket):
                now = time.monotonic()
                if said is None or now - said >= WAIT_NOTE_EVERY_S:
                    said = now
                    await say(self._waiting_note(ticket))
                changed = self._changed
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), WAIT_NOTE_EVERY_S)
        finally:
            self.queue.remove(ticket)
            self._notify()
        ticket.since = time.monotonic()
        for device in ticket.wanted:
            self.holders[device] = ticket
        try:
            yield
        finally:
            for device in ticket.wanted:
                if self.holders.get(device) is ticket:
                    del self.holders[device]
            self._notify()
