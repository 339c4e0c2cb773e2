"""The benchmarks' machine meter keeps the hypervisor's steal apart: a pass that ran while another
guest had the host's cores is reported as such, not only as a busier machine."""

from __future__ import annotations

import pytest

from benchmarks.fastpath_bench import machine_use, steal_share, stolen
from loadtest.__main__ import TICKS, CpuMeter, machine_cpu_s

# user nice system idle iowait irq softirq steal guest guest_nice, in ticks
BEFORE = "cpu  1000 0 200 5000 100 0 50 10 0 0"
AFTER = "cpu  1300 0 260 5200 100 0 60 210 0 0"


def test_stolen_time_is_busy_and_counted_apart() -> None:
    busy0, total0, stolen0 = machine_cpu_s(BEFORE)
    busy1, total1, stolen1 = machine_cpu_s(AFTER)
    assert (busy1 - busy0) * TICKS == pytest.approx(300 + 60 + 10 + 200)
    assert (total1 - total0) * TICKS == pytest.approx(300 + 60 + 200 + 10 + 200)
    assert (stolen1 - stolen0) * TICKS == pytest.approx(200)


def test_a_pass_reports_its_steal_share() -> None:
    used = {
        "cpu_s": {"api": 1.0, "loadgen": 0.5},
        "other_processes_cpu_s": 0.2,
        "machine_busy_cpu_s": 7.7,
        "machine_total_cpu_s": 10.0,
        "machine_stolen_cpu_s": 2.5,
    }
    assert steal_share(used) == 0.25
    assert machine_use(used, 100)["machine_steal"] == 0.25
    assert steal_share({"machine_total_cpu_s": 10.0}) == 0.0  # a meter from before steal was kept


def test_the_row_names_steal_only_when_there_was_some() -> None:
    assert stolen({"machine_steal": 0.0}, {"machine_steal": 0.0}) == ""
    assert stolen({"machine_steal": 0.012}, {"machine_steal": 0.2}) == " (steal 0.012 / 0.2)"


def test_the_real_meter_reads_steal_from_proc() -> None:
    meter = CpuMeter(dict)
    meter.begin()
    used = meter.finish()
    assert used["machine_stolen_cpu_s"] >= 0.0
    assert used["machine_stolen_cpu_s"] <= used["machine_busy_cpu_s"] + 0.1
