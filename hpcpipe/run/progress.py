"""What a run shows and hears while it goes: rank 0's progress, and SIGTERM / SIGINT."""

from __future__ import annotations

import signal
import sys
import time


class Progress:
    """Rank-0 progress: a bar on a terminal, periodic plain lines in a batch log."""

    def __init__(self, mode: str, total: int, label: str, enabled: bool):
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if enabled else "off"
        self.total, self.label = total, label
        self.t0 = self.last = time.perf_counter()

    def update(self, it: int, loss: float, mtime: float, force: bool = False) -> None:
        if self.mode == "off":
            return
        now = time.perf_counter()
        if self.mode == "bar":
            if force or now - self.last > 0.2:
                frac = it / self.total
                bar = "#" * int(30 * frac)
                sys.stderr.write(
                    f"\r{self.label} [{bar:<30}] {it}/{self.total} "
                    f"loss {loss:.4g} pipeline time {mtime:.4g}"
                )
                sys.stderr.flush()
                self.last = now
            if force:
                sys.stderr.write("\n")
        elif force or now - self.last > 10.0:
            sys.stderr.write(
                f"{self.label}: iteration {it}/{self.total} loss {loss:.6g} "
                f"pipeline time {mtime:.6g} wall {now - self.t0:.1f}s\n"
            )
            sys.stderr.flush()
            self.last = now


class StopFlag:
    """SIGTERM / SIGINT set a flag; the loop stops at the end of the iteration."""

    def __init__(self):
        self.raised = False
        self._old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass

    def _handle(self, signum, frame):
        self.raised = True

    def restore(self):
        for sig, h in self._old.items():
            signal.signal(sig, h)
        self._old = {}

    def __enter__(self) -> StopFlag:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()
