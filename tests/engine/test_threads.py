"""The thread choice (engine/threads.py) against a scripted clock, CPU reading
and machine: each step's time follows from the threads it ran on and the
cores other programs hold, as measured on 2 vCPUs in issue 43."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from localserve.engine import threads as threads_module
from localserve.engine.threads import HOLD_S, TICK_S, CpuUse, ThreadChooser


@dataclass
class Machine:
    """`cores` cores, `busy` of them held by other programs. A step on `n`
    threads takes `base / n` while every thread has a core; the share of a
    thread without one stalls every barrier (up to `stall` x slower)."""

    cores: int
    busy: float = 0.0
    base: float = 0.02
    stall: float = 4.0
    now: float = 0.0
    reading: float | None = None  # what the CPU reading says; None: the truth (as other programs get it)
    averaged: bool = False  # the reading is the mean since the previous one (as CpuUse's), not the moment's
    log: list[int] = field(default_factory=list)
    used: float = 0.0  # core-seconds other programs got so far ...
    read_at: float = 0.0  # ... and at the last reading
    read_used: float = 0.0

    def step_s(self, n: int) -> float:
        free = self.cores - self.busy
        overflow = n - free
        if overflow >= 1.0:  # whole threads wait for a core at every barrier
            return self.base / max(1.0, free) * self.stall
        return self.base / n * (1.0 + (self.stall - 1.0) * max(0.0, overflow))

    def share(self, n: int) -> float:
        """The cores the neighbour gets while our steps run on `n` threads:
        competing for the cores, its share of what all runnable threads want."""
        if n + self.busy <= self.cores:
            return self.busy
        return self.busy * self.cores / (n + self.busy)

    def busy_elsewhere(self) -> float:
        if self.reading is not None:
            return self.reading
        if not self.averaged:
            return self.share(self.chooser.threads)
        wall = self.now - self.read_at
        mean = (self.used - self.read_used) / wall if wall > 0 else 0.0
        self.read_at, self.read_used = self.now, self.used
        return mean

    def clock(self) -> float:
        return self.now

    def attach(self, max_threads: int) -> ThreadChooser:
        self.chooser = ThreadChooser(
            max_threads, busy_elsewhere=self.busy_elsewhere, clock=self.clock, num_cores=self.cores
        )
        return self.chooser

    def run(self, seconds: float, predicted: float | None = None) -> None:
        """Steps for `seconds`; the prediction is the quiet speed at all threads unless given."""
        end = self.now + seconds
        while self.now < end:
            n = self.chooser.threads
            took = self.step_s(n)
            self.now += took
            self.chooser.observe(took, predicted if predicted is not None else self.base / self.chooser.max_threads)
            self.log.append(self.chooser.threads)


def test_a_quiet_machine_keeps_every_thread() -> None:
    machine = Machine(cores=2)
    chooser = machine.attach(2)
    machine.run(10.0)
    assert chooser.threads == 2
    assert chooser.switches == 0


def test_one_busy_core_of_two_means_one_thread_and_a_freed_core_brings_it_back() -> None:
    machine = Machine(cores=2)
    chooser = machine.attach(2)
    machine.run(2.0)
    machine.busy = 1.0
    machine.run(1.0)
    assert chooser.threads == 1  # within a few windows
    machine.run(10.0)
    assert chooser.threads == 1  # and kept: it wins
    machine.busy = 0.0
    machine.run(1.0)
    assert chooser.threads == 2
    machine.run(10.0)
    assert chooser.threads == 2
    assert chooser.switches == 2


def test_sixteen_cores_with_six_busy_settle_on_ten() -> None:
    machine = Machine(cores=16, busy=6.0)
    chooser = machine.attach(16)
    machine.run(5.0)
    assert chooser.threads == 10
    machine.busy = 2.0
    machine.run(5.0)
    assert chooser.threads == 14


def test_a_neighbour_near_half_a_core_does_not_flip_the_count() -> None:
    """Fewer below half a free core, more only above 70% of one: between, the count stays."""
    machine = Machine(cores=2, reading=0.6)
    chooser = machine.attach(2)
    machine.busy = 0.6
    machine.run(2.0)
    assert chooser.threads == 1
    switches = chooser.switches
    for reading in (0.45, 0.35, 0.5, 0.4) * 5:  # within the band: 1 thread stays
        machine.reading = reading
        machine.run(TICK_S * 2)
    assert chooser.threads == 1
    assert chooser.switches == switches
    machine.reading, machine.busy = 0.1, 0.1
    machine.run(1.0)
    assert chooser.threads == 2


def test_a_switch_that_makes_steps_slower_is_undone_and_held_off() -> None:
    """The reading says a core is busy, but fewer threads lose (the neighbour
    runs on a core the steps do not need): back to 2, not retried for HOLD_S,
    then retried with a doubled hold."""
    machine = Machine(cores=2, reading=1.0)  # busy is 0: the steps run at quiet speed on 2 threads
    chooser = machine.attach(2)
    machine.run(TICK_S * 6)
    assert chooser.threads == 2
    assert chooser.switches == 2  # tried 1, undone
    machine.run(HOLD_S * 0.8)
    assert chooser.switches == 2  # held off
    machine.run(HOLD_S * 0.5)
    assert chooser.switches == 4  # tried again after the hold, undone again
    assert chooser.threads == 2
    switches = chooser.switches
    machine.run(HOLD_S * 1.5)
    assert chooser.switches == switches  # the hold doubled


def test_a_partial_neighbour_that_appears_is_a_trial_not_a_blind_follow() -> None:
    """A reading that jumps from 0 to 0.6 of a core (a benchmark's client
    parsing answers) whose cores the steps do not actually lose: fewer threads
    are tried in a clean window, lose, and are undone, instead of being
    followed at once and kept while the reading stays in the band."""
    machine = Machine(cores=2, reading=0.0)
    chooser = machine.attach(2)
    machine.run(1.0)
    machine.reading = 0.6  # busy stays 0: two threads still run at quiet speed
    machine.run(TICK_S * 10)
    assert chooser.threads == 2
    assert chooser.switches == 2  # tried 1, lost, undone


def test_a_reading_that_moves_by_a_core_ends_a_hold() -> None:
    machine = Machine(cores=4, reading=1.0)
    chooser = machine.attach(4)
    machine.run(TICK_S * 6)
    assert (chooser.threads, chooser.switches) == (4, 2)  # 3 tried and undone
    machine.reading, machine.busy = 2.2, 2.2  # two cores now truly busy
    machine.run(TICK_S * 8)
    assert chooser.threads == 2


def test_slow_steps_with_no_neighbour_seen_try_one_thread_fewer_and_keep_it_only_if_it_wins() -> None:
    # Contention the CPU reading cannot see (another VM on the same host): steps
    # at 2 threads stall, at 1 they run at full speed.
    machine = Machine(cores=2, busy=1.0, reading=0.0)
    chooser = machine.attach(2)
    machine.run(2.0)
    assert chooser.threads == 1
    # The same slowness where one thread does not help: undone.
    machine = Machine(cores=2, reading=0.0, base=0.02)
    chooser = machine.attach(2)
    machine.run(2.0, predicted=0.005)  # steps run 2x slower than predicted whatever the count
    assert chooser.threads == 2
    assert chooser.switches == 2


def test_fewer_than_three_steps_judge_no_times_but_a_moved_reading_is_followed() -> None:
    calls = []
    now = [0.0]
    reading = [0.0]

    def cpu() -> float:
        calls.append(now[0])
        return reading[0]

    chooser = ThreadChooser(2, busy_elsewhere=cpu, clock=lambda: now[0], num_cores=2)
    now[0] = TICK_S / 2
    chooser.observe(0.01, 0.01)
    assert not calls  # a short window reads nothing
    now[0] = TICK_S * 2
    chooser.observe(0.01, 0.01)
    chooser.observe(0.01, 0.01)
    assert calls and chooser.threads == 2  # a quiet machine: the first reading
    now[0] += 5.0
    chooser.observe(5.0, 0.01)
    chooser.observe(5.0, 0.01)
    assert chooser.threads == 2  # two steps, however slow: their times alone decide nothing
    reading[0] = 2 / 3  # one spinning neighbour's share against our two threads
    now[0] += 5.0
    chooser.observe(5.0, 0.01)  # the second step of this window: the moved reading is enough
    assert chooser.threads == 1


def test_cpu_use_sees_a_spinning_neighbour() -> None:
    """The real reading: a process spinning on one core shows as about one core busy elsewhere."""
    import subprocess
    import sys
    import time

    if (threads_module.os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores")
    use = CpuUse()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        use.busy_elsewhere()
        time.sleep(1.0)
        busy = use.busy_elsewhere()
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.6 <= busy <= 2.0
    time.sleep(0.3)
    use.busy_elsewhere()
    assert use.busy_elsewhere() == use.busy_elsewhere()  # cached within MIN_SAMPLE_S


def test_follow_reading_applies_the_suggestion_once_a_window() -> None:
    machine = Machine(cores=2, reading=1.0)
    chooser = machine.attach(2)
    machine.now = TICK_S
    assert chooser.follow_reading() == 1
    machine.reading = 0.0
    assert chooser.follow_reading() == 1  # within the window: no new reading
    machine.now += TICK_S
    assert chooser.follow_reading() == 2


def bursts_on_the_right_count(machine: Machine, bursts: int = 10) -> tuple[float, float]:
    """A neighbour that spins 2 s and idles 2 s (bench/busy_desktop.py's
    bursty load) on one core: the shares of the steps, and of the time, that
    ran on the count their moment called for."""
    machine.run(1.0)
    steps_right = num_steps = 0
    time_right = time_total = 0.0
    for burst in range(bursts):
        machine.busy = 1.0 if burst % 2 == 0 else 0.0
        end = machine.now + 2.0
        while machine.now < end:
            start, right = machine.now, machine.chooser.threads == (1 if machine.busy else 2)
            machine.run(1e-9)  # one step
            steps_right, num_steps = steps_right + right, num_steps + 1
            time_right, time_total = time_right + right * (machine.now - start), time_total + machine.now - start
    return steps_right / num_steps, time_right / time_total


def test_a_bursty_neighbour_is_followed_within_a_window_of_each_change() -> None:
    """The count follows each change of a bursty neighbour at once, without
    a trial, so nearly every step runs on the count its moment calls for."""
    machine = Machine(cores=2)
    chooser = machine.attach(2)
    steps, _ = bursts_on_the_right_count(machine)
    assert steps > 0.8, steps
    assert chooser.switches >= 9


def test_a_bursty_neighbour_is_followed_at_eight_streams_where_contended_steps_are_long() -> None:
    """The same bursty load at 8 streams: a step on both threads with one
    core taken lasts 0.4 s (issue 43: ITL 414 ms). Waiting for three such steps
    lost most of each 2 s burst; the moved reading is followed after the first
    one, so most of the time runs on the count its moment calls for."""
    machine = Machine(cores=2, base=0.09, stall=4.5)
    machine.attach(2)
    _, time_share = bursts_on_the_right_count(machine)
    assert time_share > 0.75, time_share


def bursts_straddling_steps(machine: Machine, cycles: int = 6, on_s: float = 2.0, off_s: float = 2.0) -> float:
    """The bursty neighbour again, but starting and stopping in the middle of
    steps, read as CpuUse reads it (the mean since the last reading): the
    readings around each change see part of it. The share of the time that
    ran on the count its moment called for."""
    machine.run(1.0)
    machine.busy, change = 1.0, machine.now + on_s
    end = machine.now + cycles * (on_s + off_s)
    right = total = 0.0
    while machine.now < end:
        n, left, took = machine.chooser.threads, 1.0, 0.0  # the step's work left, and its time
        while left > 0:
            step_s = machine.step_s(n)
            span = min(left * step_s, change - machine.now)
            machine.used += machine.share(n) * span
            on_right = n == (1 if machine.busy else 2)
            right, total = right + on_right * span, total + span
            machine.now, took, left = machine.now + span, took + span, left - span / step_s
            if machine.now >= change - 1e-12:
                machine.busy = 0.0 if machine.busy else 1.0
                change += on_s if machine.busy else off_s
        machine.chooser.observe(took, machine.base / machine.chooser.max_threads)
    return right / total


@pytest.mark.parametrize(("base", "streams"), [(0.018, 1), (0.144, 8)])
def test_a_bursty_neighbour_read_as_cpu_use_reads_it_is_followed_within_a_step_or_two(
    base: float, streams: int
) -> None:
    """A reading is a mean since the last one, so the reading that straddles a
    change sees part of it: a burst's start reads as 0.3 of a core, its end
    as 0.4. The chooser reads after any step (every READ_S, not once a
    window), takes a rising reading with a stalled step as an arrival, and
    grows as soon as a reading shows the core free: issue 43's trace at 8
    streams (2 threads 72 ms a step, 1 thread 140 ms) lost half a second at
    each change before (0.84 of the time on the right count here; now 0.91)."""
    machine = Machine(cores=2, base=base, stall=3.0, averaged=True)
    machine.attach(2)
    share = bursts_straddling_steps(machine)
    assert share > 0.9, (streams, share)  # 0.84 at 8 streams when read once a window


@pytest.mark.parametrize("resumes", [True, False])
def test_cpu_another_program_used_while_this_model_idled_is_not_read_as_a_neighbour(resumes: bool) -> None:
    """Runs alternate with another program's (bench/guard.py's two servers, a
    page the user loads between two questions): while this model computes
    nothing, the other takes both cores, and stops before the next run. A
    reading across the pause said 1.9 cores busy, and the first step of each
    run, the longest (its prompts), went to one thread. `resume` starts the
    reading with the work: the runs keep both threads."""
    machine = Machine(cores=2, base=0.144, averaged=True)
    chooser = machine.attach(2)
    machine.run(2.0)
    ran_on: list[int] = []
    for _ in range(5):
        machine.used += 2.0 * 3.0  # the other program's run: both cores for 3 s, then it ends
        machine.now += 3.0
        if resumes:
            chooser.resume(3.0)
        machine.log.clear()
        machine.run(1.5)
        ran_on += machine.log
    if resumes:
        assert set(ran_on) == {2}
        assert chooser.switches == 0
    else:  # what the reading across the pause did: the first steps of every run on one thread
        assert ran_on.count(1) >= 5


def test_a_short_pause_keeps_the_reading_going() -> None:
    """A pause shorter than `IDLE_S` (the next request of a closed loop) does
    not restart anything: a neighbour read across it is still followed."""
    machine = Machine(cores=2, base=0.144, averaged=True)
    chooser = machine.attach(2)
    machine.run(2.0)
    machine.busy = 1.0
    chooser.resume(threads_module.IDLE_S / 2)
    machine.run(1.0)
    assert chooser.threads == 1
