"""The llama.cpp engine's default thread count: the CPUs that are free now, sampled from /proc/stat."""

from __future__ import annotations

import pytest

from dp_textgrad.engines import llama_support

# /proc/stat as Linux writes it: an aggregate "cpu" line, one line per CPU (user nice system idle
# iowait irq softirq steal guest guest_nice, in clock ticks), then other counters.
_STAT = """cpu  {a0} 0 {a1} {a2} 0 0 0 0 0 0
cpu0 {u0} 0 0 {i0} 0 0 0 0 0 0
cpu1 {u1} 0 0 {i1} 0 0 0 0 0 0
intr 123 0 0
ctxt 456
"""


def stat(busy0: int, idle0: int, busy1: int, idle1: int) -> str:
    return _STAT.format(a0=busy0 + busy1, a1=0, a2=idle0 + idle1, u0=busy0, i0=idle0, u1=busy1, i1=idle1)


def reader(*samples: str | None):
    """A /proc/stat reader that returns the given texts in turn."""
    queue = list(samples)
    return lambda: queue.pop(0)


def no_sleep(seconds: float) -> None:
    assert seconds == llama_support.SAMPLE_SECONDS


def test_cpu_times_reads_each_cpu_line() -> None:
    text = "cpu  10 2 3 40 5 1 1 0 7 0\ncpu0 4 1 1 20 3 1 0 0 7 0\ncpu1 6 1 2 20 2 0 1 0 0 0\nintr 1 2\n"
    # busy = user + nice + system + irq + softirq + steal (guest is inside user); idle + iowait is not.
    assert llama_support.cpu_times(text) == {0: (7, 30), 1: (10, 32)}
    assert llama_support.cpu_times("intr 1 2\n") == {}


def test_busy_now_is_the_busy_share_of_each_cpu_between_two_reads() -> None:
    # Over the sample: cpu0 busy 20 of 20 ticks, cpu1 busy 5 of 20.
    before, after = stat(100, 100, 100, 100), stat(120, 100, 105, 115)
    busy = llama_support.busy_now(reader(before, after), no_sleep, cpus={0, 1})
    assert busy == pytest.approx(1.25)
    # CPUs outside the affinity mask are not counted.
    assert llama_support.busy_now(reader(before, after), no_sleep, cpus={1}) == pytest.approx(0.25)
    # No counters, or no ticks between the reads: unknown.
    assert llama_support.busy_now(reader(None), no_sleep, cpus={0, 1}) is None
    assert llama_support.busy_now(reader(before, before), no_sleep, cpus={0, 1}) is None


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("DP_TEXTGRAD_THREADS", raising=False)
    monkeypatch.setattr(llama_support, "available_cpus", lambda: 2)
    monkeypatch.setattr(llama_support.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(llama_support, "SAMPLE_SECONDS", 0.0, raising=False)
    return monkeypatch


def test_idle_cpus_now_are_used_even_when_the_load_average_is_high(two_cpus: pytest.MonkeyPatch) -> None:
    # Right after a `pip install` on 2 CPUs the 1-minute load average is still about 2 while both
    # CPUs are idle: the engine must take both (the load average alone gave one thread).
    two_cpus.setattr(llama_support.os, "getloadavg", lambda: (2.0, 1.5, 1.0))
    idle_now = reader(stat(500, 100, 500, 100), stat(500, 120, 501, 119))
    two_cpus.setattr(llama_support, "read_proc_stat", idle_now, raising=False)
    assert llama_support.default_threads() == 2


def test_cpus_busy_now_are_left_alone_even_when_the_load_average_is_low(two_cpus: pytest.MonkeyPatch) -> None:
    two_cpus.setattr(llama_support.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    # One CPU busy throughout the sample: one thread.
    two_cpus.setattr(llama_support, "read_proc_stat", reader(stat(0, 0, 0, 0), stat(20, 0, 0, 20)), raising=False)
    assert llama_support.default_threads() == 1
    # Both busy: still at least one thread.
    two_cpus.setattr(llama_support, "read_proc_stat", reader(stat(0, 0, 0, 0), stat(20, 0, 20, 0)), raising=False)
    assert llama_support.default_threads() == 1
    # DP_TEXTGRAD_THREADS overrides the sample.
    two_cpus.setenv("DP_TEXTGRAD_THREADS", "2")
    assert llama_support.default_threads() == 2


def test_without_proc_stat_the_load_average_decides(two_cpus: pytest.MonkeyPatch) -> None:
    two_cpus.setattr(llama_support, "read_proc_stat", lambda: None, raising=False)
    two_cpus.setattr(llama_support.os, "getloadavg", lambda: (1.2, 0.0, 0.0))
    assert llama_support.busy_cpus() == 1
    assert llama_support.default_threads() == 1


def test_proc_stat_is_read_from_the_running_system() -> None:
    text = llama_support.read_proc_stat()
    if text is None:
        pytest.skip("no /proc/stat on this system")
    assert llama_support.cpu_times(text)  # at least one cpuN line parses
    busy = llama_support.busy_cpus()
    assert 0 <= busy <= max(llama_support.available_cpus(), len(llama_support.cpu_times(text)))
