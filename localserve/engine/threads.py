"""Threads that adapt: how many CPU threads the next step computes on.

A desktop server shares its cores with a browser, an editor, a build. The
CPU threads of one llama.cpp step meet at a barrier after every operation,
so one thread that the OS descheduled stalls the whole graph. Measured on 2
vCPUs with one other process spinning on one core (issue 43): two threads
fell to a fifth of their quiet speed at one stream, one thread kept 80%.

Two signals choose the count: the step times over short windows (`TICK_S`
and `MIN_STEPS` steps at least, never a single step), and the CPU reading,
taken after any step every `READ_S` (contended steps can be long, and a
2 s burst must not wait for a window of them):

- `CpuUse`: the cores that other programs keep busy, from the system's CPU
  times minus this process's own (psutil; steal time counts, it is a core
  the hypervisor gave elsewhere). The count it suggests is the cores left
  free, rounded half down: on 2 cores a neighbour that takes 0.67 of a core
  while it competes with two spinning threads already means one thread.
- The step times: each step's measured seconds over what the step-time
  model (`engine/step/step_model.py`) predicts. A switch is a trial: its window's
  ratio is compared with the window before it, and the switch is undone
  when it made steps slower (`MARGIN`). When the reading moves by half a
  core or more (a burst starts or ends) to a neighbour that holds a core
  (`CLEAR_CORE`), or to a partial one while the steps ran much slower than
  predicted (`SLOW_RATIO`: a spinning neighbour competing with our threads
  gets only 2/3 of a core on 2 cores, yet stalls every step), or leaves one
  free, or rises by `RISE_CORES` with a step that ran much slower than
  predicted (the reading that straddles a burst's start sees only part of
  it: 0.3 of a core), the count follows it at once, without
  a trial: that window mixed two conditions, so nothing is a fair
  baseline, and a neighbour that comes and goes every few seconds must not
  wait two windows at each change. A move to a partial neighbour (the
  load generator of a benchmark, a browser tab) waits for a clean window
  and is then a trial like any other. An undone switch is not tried again
  for a hold time that doubles up to `MAX_HOLD_S`, unless the other
  programs' use moves by a core. Steps that run much slower than predicted
  with no visible neighbour (`SLOW_RATIO`) try one thread fewer, kept only
  when it wins.

`ThreadChooser` is pure logic over an injected clock and CPU reading, so
tests drive it with scripted ones; `StepWorker` calls `observe` after each
step and hands a changed count to `GenerativeBackend.set_cpu_threads`. The
one-shot queue (`engine/oneshot/queue.py`) follows the reading alone
(`follow_reading`) before each run: its runs differ too much in size for
their times to judge a switch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

TICK_S = 0.2  # a decision window: at least this long ...
MIN_STEPS = 3  # ... and this many steps
MARGIN = 0.10  # a trial switch is undone when its steps run this much slower than before it
EXPLORE_GAIN = 0.10  # a switch the CPU reading did not suggest is kept only when this much faster
SLOW_RATIO = 1.5  # steps this much slower than predicted, with no neighbour seen, try one thread fewer
HOLD_S = 5.0  # an undone switch waits this long before it is tried again (doubling) ...
MAX_HOLD_S = 60.0  # ... up to this
MOVED_CORES = 0.5  # a reading this far from the last one means the window mixed two conditions
GROW_SLACK = 0.3  # one more thread only when its core is at least 70% free
CLEAR_CORE = 0.8  # a moved reading is followed at once to fewer threads only for neighbours this busy
MIN_SAMPLE_S = 0.08  # CpuUse re-reads the counters at most this often (a little under READ_S) ...
READ_S = 0.1  # ... and the chooser reads it at most this often, after any step
RISE_CORES = 0.25  # a reading this much higher, with a slow step, is a neighbour arriving
IDLE_S = MIN_SAMPLE_S  # work after a pause this long starts a fresh reading (`resume`: CpuUse re-reads by then)


class CpuUse:
    """Cores that other processes keep busy, averaged since the previous
    reading (which is at least `MIN_SAMPLE_S` old). Thread-safe: every step
    thread of the process shares one (`shared_cpu_use`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._process = psutil.Process()
        self._lock = threading.Lock()
        self._last = self._read()
        self._busy_elsewhere = 0.0

    def _read(self) -> tuple[float, float, float]:
        times = psutil.cpu_times()
        busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
        # guest time is already inside user time on Linux
        busy -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
        own = self._process.cpu_times()
        return self._clock(), busy, own.user + own.system

    def busy_elsewhere(self) -> float:
        """Cores other processes used since the last reading (0 when unknown)."""
        with self._lock:
            now = self._clock()
            if now - self._last[0] >= MIN_SAMPLE_S:
                try:
                    current = self._read()
                except (OSError, psutil.Error):  # counters unreadable here: assume a quiet machine
                    return 0.0
                wall = current[0] - self._last[0]
                other = (current[1] - self._last[1]) - (current[2] - self._last[2])
                self._busy_elsewhere = max(0.0, other / wall) if wall > 0 else 0.0
                self._last = current
            return self._busy_elsewhere


_shared: CpuUse | None = None
_shared_lock = threading.Lock()


def shared_cpu_use() -> CpuUse:
    """The process's one `CpuUse`."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CpuUse()
        return _shared


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What the chooser shows: the count in use and why."""

    threads: int  # the count the next step computes on
    max_threads: int
    adaptive: bool  # False: --threads N pinned the count
    busy_elsewhere: float  # cores other programs kept busy in the last window
    switches: int  # changes of count so far


@dataclass(slots=True)
class _Trial:
    previous: int  # the count before the switch
    previous_ratio: float  # its window's measured / predicted step time
    suggested: bool  # the CPU reading asked for it (else an exploration)


class ThreadChooser:
    """Chooses the thread count of the next step (module doc). The step
    thread owns it: `observe` after each step; `threads` is the count."""

    def __init__(
        self,
        max_threads: int,
        *,
        busy_elsewhere: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        num_cores: int | None = None,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads
        self.switches = 0
        self.why = ""  # what made the last switch (the step thread logs it)
        self.last_busy_elsewhere = 0.0
        self._read_once = False
        self._busy = busy_elsewhere
        self._clock = clock
        self._cores = num_cores or os.cpu_count() or self.max_threads
        self._window_start = clock()
        self._read_at = self._window_start  # the last CPU reading ...
        self._latest = 0.0  # ... and what it said
        self._ratio_sum = 0.0
        self._num_steps = 0
        self._trial: _Trial | None = None
        self._held: dict[tuple[int, int], tuple[float, float]] = {}  # (from, to) -> (until, busy then)
        self._hold_s: dict[tuple[int, int], float] = {}

    def state(self, *, adaptive: bool = True) -> ThreadState:
        return ThreadState(self.threads, self.max_threads, adaptive, self.last_busy_elsewhere, self.switches)

    def suggested(self, busy_elsewhere: float) -> int:
        """The count the CPU reading asks for: fewer when the free cores,
        rounded half down, are fewer than the threads; more only when the
        extra core is at least `1 - GROW_SLACK` free (a band between the two,
        so a neighbour near half a core does not flip the count each window)."""
        free = self._cores - busy_elsewhere
        target = self.threads
        fewer = math.ceil(free - 0.5)
        more = math.floor(free + GROW_SLACK)
        if fewer < target:
            target = fewer
        elif more > target:
            target = more
        return max(1, min(self.max_threads, target))

    def _clearly_free(self, busy_elsewhere: float) -> int:
        """The thread count when neighbours that hold at least `CLEAR_CORE`
        of a core count as whole cores (and less as none)."""
        held = math.floor(busy_elsewhere + 1.0 - CLEAR_CORE)
        return max(1, min(self.max_threads, self._cores - held))

    def follow_reading(self) -> int:
        """The count the CPU reading alone suggests, read at most once a
        window: for work whose runs vary too much in size to judge a switch
        by their times (the one-shot queue, which reads before each run and so keeps reading across its pauses)."""
        now = self._clock()
        if now - self._window_start >= TICK_S:
            self._window_start = now
            self.last_busy_elsewhere = self._busy()
            self._switch(self.suggested(self.last_busy_elsewhere), f"CPU busy elsewhere {self.last_busy_elsewhere:.2f}")
        return self.threads

    def resume(self, idle_s: float) -> None:
        """Work starts again after `idle_s` without any. A reading that spans
        the pause counts what other programs did while this model computed
        nothing (another server's run, a page the user loaded) as if it
        competed with the next steps: seen in `bench/guard.py`, where the
        other server's run read as 1.9 cores busy and the first, longest step
        of each run went to one thread. So the next reading starts here, and
        the next window too; the count stays as it was (a neighbour that came
        during the pause is seen after the first step, one that stayed was
        already followed)."""
        if idle_s < IDLE_S:
            return
        now = self._clock()
        self._busy()  # CpuUse averages since its last reading: restart it now
        self._read_at = now
        self._ratio_sum, self._num_steps, self._window_start = 0.0, 0, now

    def observe(self, measured_s: float, predicted_s: float) -> int:
        """One step that ran on `threads`; returns the count for the next."""
        step_ratio = 0.0
        if predicted_s > 0 and 0 <= measured_s < math.inf:
            step_ratio = measured_s / predicted_s
            self._ratio_sum += step_ratio
            self._num_steps += 1
        now = self._clock()
        if self._read_once and now - self._read_at >= READ_S and self._edge(now, step_ratio):
            return self.threads
        if now - self._window_start < TICK_S or self._num_steps < MIN_STEPS:
            # Too few steps to judge their times (contended steps are long:
            # 8 streams on 2 threads with one core taken, 0.4 s each); a
            # neighbour that arrived or left is caught by `_edge` meanwhile.
            if not self._read_once and now - self._window_start >= TICK_S:
                self._reading(now)
            return self.threads
        ratio = self._ratio_sum / self._num_steps
        self._ratio_sum, self._num_steps, self._window_start = 0.0, 0, now
        busy = self._reading(now) if now - self._read_at >= READ_S else self._latest
        if self._moved(busy):
            self._follow_move(busy, now, slow=ratio > SLOW_RATIO, step_ratio=ratio)
            return self.threads
        self.last_busy_elsewhere, self._read_once = busy, True
        if self._trial is not None:
            self._judge(self._trial, ratio, busy, now)
            self._trial = None
            return self.threads
        target = self.suggested(busy)
        if target != self.threads:
            self._try(target, ratio, busy, now, suggested=True)
        elif ratio > SLOW_RATIO and self.threads > 1:
            self._try(self.threads - 1, ratio, busy, now, suggested=False)
        return self.threads

    def _reading(self, now: float) -> float:
        self._read_at, self._latest = now, self._busy()
        return self._latest

    def _edge(self, now: float, step_ratio: float) -> bool:
        """A fresh reading after any step (every `READ_S`), between windows: a
        neighbour that arrived or left is followed within a step or two,
        whatever the window. A reading that straddles the change shows only
        part of it, so a rise of `RISE_CORES` counts as an arrival when the
        step it came with ran much slower than predicted (a spinning
        neighbour stalls every barrier of ours). True when it switched."""
        busy = self._reading(now)
        slow = step_ratio > SLOW_RATIO or (self._num_steps > 0 and self._ratio_sum / self._num_steps > SLOW_RATIO)
        rose = busy - self.last_busy_elsewhere
        if self._moved(busy):
            self._follow_move(busy, now, slow=slow, step_ratio=step_ratio)
            return True
        if slow and rose >= RISE_CORES and self.threads > 1:
            self._follow_move(busy, now, slow=True, at_least=1, step_ratio=step_ratio)
            return True
        return False

    def _moved(self, busy: float) -> bool:
        """The reading moved by `MOVED_CORES` or more since the last window."""
        return self._read_once and abs(busy - self.last_busy_elsewhere) >= MOVED_CORES

    def _follow_move(self, busy: float, now: float, *, slow: bool, at_least: int = 0, step_ratio: float = 0.0) -> None:
        """The neighbours changed (a build started, a burst ended). This window
        mixed two conditions, so it is no fair baseline for a trial. A
        neighbour that clearly holds (or left) a core is followed at once: one
        that comes and goes every few seconds must not wait two windows at
        each change, and a switch the next windows find slower is still caught
        (SLOW_RATIO). So is a partial one while the steps ran much slower than
        predicted (`slow`): a spinning process that competes with our threads
        gets only its share of the cores, and stalls every step. A partial one
        whose steps kept their speed (a client parsing answers, a browser tab)
        is only a suggestion: the next, clean window starts a trial that the
        step times judge. `at_least`: threads to give up whatever the
        reading suggests (a rising reading that saw only part of the change)."""
        self._ratio_sum, self._num_steps, self._window_start = 0.0, 0, now
        self.last_busy_elsewhere = busy
        self._trial = None
        target = self.suggested(busy)
        if at_least:
            target = min(target, self.threads - at_least)
        if target > self.threads or self._clearly_free(busy) <= target or (slow and target < self.threads):
            self._switch(
                target,
                f"CPU busy elsewhere {'rose' if at_least else 'moved'} to {busy:.2f}"
                + (f", steps slow ({step_ratio:.2f}x)" if slow else ""),
            )

    def _try(self, target: int, ratio: float, busy: float, now: float, *, suggested: bool) -> None:
        key = (self.threads, target)
        held = self._held.get(key)
        if held is not None:
            until, busy_then = held
            if now < until and abs(busy - busy_then) < 1.0:
                return
        self._trial = _Trial(self.threads, ratio, suggested)
        why = f"CPU busy elsewhere {busy:.2f}" if suggested else f"steps {ratio:.2f}x predicted"
        self._switch(target, f"trial: {why}")

    def _judge(self, trial: _Trial, ratio: float, busy: float, now: float) -> None:
        """Keep the switch, or undo it and hold it off for a while."""
        if trial.suggested:
            lost = ratio > trial.previous_ratio * (1.0 + MARGIN)
        else:
            lost = ratio > trial.previous_ratio * (1.0 - EXPLORE_GAIN)
        key = (trial.previous, self.threads)
        if not lost:
            self._hold_s.pop(key, None)
            return
        hold = self._hold_s.get(key, HOLD_S / 2) * 2
        self._hold_s[key] = min(MAX_HOLD_S, hold)
        self._held[key] = (now + self._hold_s[key], busy)
        self._switch(trial.previous, f"trial undone: steps {ratio:.2f}x predicted, {trial.previous_ratio:.2f}x before")

    def _switch(self, threads: int, why: str) -> None:
        if threads != self.threads:
            self.threads = threads
            self.switches += 1
            self.why = why
