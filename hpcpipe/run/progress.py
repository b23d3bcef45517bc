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


class Waiting:
    """Rank-0 progress of a wait that is not a run's iterations (training the attack's
    classifier on first use, ...): nothing for the first ``delay`` seconds, so short
    waits stay quiet; then, like ``Progress``, a bar on a terminal (redrawn at most every
    0.2 s) or a plain line every 10 s in a batch log, on stderr; ``off`` (or not
    ``enabled``: the other ranks) shows nothing. ``clock`` is injectable for tests."""

    def __init__(
        self,
        label: str,
        total: int,
        mode: str = "auto",
        enabled: bool = True,
        delay: float = 2.0,
        stream=None,
        clock=None,
    ):
        self.stream = stream if stream is not None else sys.stderr
        clock = clock or time.monotonic
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode if enabled else "off"
        self.label, self.total, self.delay, self.clock = label, max(total, 1), delay, clock
        self.t0 = clock()
        self.last: float | None = None  # when a line was last shown (None: never)

    def update(self, done: int) -> None:
        """``done`` of ``total`` steps are done."""
        if self.mode == "off":
            return
        now = self.clock()
        if now - self.t0 < self.delay:
            return
        every = 0.2 if self.mode == "bar" else 10.0
        if self.last is not None and now - self.last < every:
            return
        self._show(done, now)

    def _show(self, done: int, now: float) -> None:
        text = f"{self.label}: {done}/{self.total} ({now - self.t0:.0f} s)"
        if self.mode == "bar":
            bar = "#" * int(30 * done / self.total)
            self.stream.write(f"\r{self.label} [{bar:<30}] {done}/{self.total}")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.last = now

    def close(self) -> None:
        """The wait is over: end the bar's line (only if anything was shown)."""
        if self.mode != "off" and self.last is not None:
            self._show(self.total, self.clock())
            if self.mode == "bar":
                self.stream.write("\n")
                self.stream.flush()


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
