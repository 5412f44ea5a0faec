"""``tfdist bench --benchmarks=balance``: its pure parts, no process launched.

The ideal, the per-epoch rows (step time, shares from the chief's ``Balance:`` lines, the
other processes' CPU), the steady-state summary and its ratios, the A/B sides' figures
(fits alternated in one launch), the plot, and the refusals of the options and of the
``--balance_sides`` flag. The launch itself is run by hand
(docs/benchmarks.md); the suite's budget has no room for another multi-process launch.
"""

import math
import statistics

import pytest

from tfdist.bench.balance import parent as balance
from tfdist.bench.balance.plot import plot_balance
from tfdist.bench.harness import common

LINE = (
    "Balance: worker:0 takes 83, worker:1 takes 45 of every global batch of 128 "
    "(worker:0 computes at 1.00x, worker:1 computes at 0.54x the fastest's rate)."
)
BACK = (
    "Balance: back to the even split (worker:0 takes 64, worker:1 takes 64 of 128): a smaller "
    "share was to cut worker:1's compute from 9.1 to 6.2 ms per update, and it computed 9.0 ms"
)


def test_a_split_is_parsed_from_the_chiefs_lines():
    assert balance.parse_split(LINE) == {"worker:0": 83, "worker:1": 45}
    assert balance.parse_split(BACK) == {"worker:0": 64, "worker:1": 64}
    assert balance.parse_split("Straggler: worker:1 takes 2x") is None
    assert balance.parse_split("Balance: nothing to split") is None


def test_the_split_in_effect_is_the_last_before_the_time_else_even():
    even = {"worker:0": 64, "worker:1": 64}
    splits = [{"t": 2.0, "line": LINE}, {"t": 5.0, "line": BACK}]
    assert balance.shares_at(splits, 1.0, even) == even
    assert balance.shares_at(splits, 2.0, even) == {"worker:0": 83, "worker:1": 45}
    assert balance.shares_at(splits, 4.9, even) == {"worker:0": 83, "worker:1": 45}
    assert balance.shares_at(splits, 9.0, even) == even


def _epochs(times, cpu_per_s, hog_per_s=0.0, busy_per_s=None):
    return [
        {
            "t": t,
            "cpu": cpu_per_s * t,
            "hog_cpu": hog_per_s * t,
            "busy_cpu": None if busy_per_s is None else busy_per_s * t,
        }
        for t in times
    ]


def test_epoch_rows_give_step_time_shares_and_the_others_cpu():
    times = [10.0, 12.0, 13.0, 14.0]  # the fit's start, then 3 epochs
    tasks = {
        "worker-0": {
            "epochs": _epochs(times, 1.0, busy_per_s=2.5),
            "splits": [{"t": 2.5, "line": LINE}],
        },
        "worker-1": {"epochs": _epochs(times, 0.5, hog_per_s=0.5)},
    }
    rows = balance.epoch_rows(tasks, "worker-0", steps_per_epoch=4, global_batch_size=128)
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert [r["end_s"] for r in rows] == [2.0, 3.0, 4.0]
    assert [r["step_s"] for r in rows] == pytest.approx([0.5, 0.25, 0.25])
    assert rows[0]["shares"] == {"worker:0": 64, "worker:1": 64}
    assert rows[2]["shares"] == {"worker:0": 83, "worker:1": 45}
    # 2.5 busy cores less 1 (worker 0) + 0.5 (worker 1) + 0.5 (its hog): 0.5 other.
    assert [r["others_cpu"] for r in rows] == pytest.approx([0.5] * 3)


def test_others_cpu_is_unknown_under_ps_or_for_too_short_an_epoch():
    ps = {"chief-0": {"epochs": _epochs([0.0, 1.0], 0.1, busy_per_s=2.0)}}
    rows = balance.epoch_rows(ps, "chief-0", steps_per_epoch=1, global_batch_size=2)
    assert rows[0]["others_cpu"] is None  # the serving workers recorded nothing
    short = [0.0, balance.MIN_SECONDS_FOR_OTHERS / 2]
    tasks = {f"worker-{i}": {"epochs": _epochs(short, 1.0, busy_per_s=2.0)} for i in range(2)}
    rows = balance.epoch_rows(tasks, "worker-0", steps_per_epoch=1, global_batch_size=2)
    assert rows[0]["others_cpu"] is None


def test_steady_skips_the_settling_epochs_and_busy_ones():
    rows = [
        {"epoch": 1, "step_s": 9.0, "others_cpu": 0.0},  # settling
        {"epoch": 2, "step_s": 1.0, "others_cpu": 0.1},
        {"epoch": 3, "step_s": 5.0, "others_cpu": 0.9},  # busy
        {"epoch": 4, "step_s": 2.0, "others_cpu": None},  # unknown counts as clean
    ]
    got = balance.steady(rows, settle=1)
    assert got["step_s"] == pytest.approx(1.5)
    assert (got["epochs_used"], got["epochs_clean"], got["others_cpu_max"]) == (2, 2, 0.9)
    every_busy = [dict(r, others_cpu=1.0) for r in rows]
    assert balance.steady(every_busy, settle=1)["step_s"] == pytest.approx(2.0)  # then all


def test_the_ideal_is_the_global_batch_over_the_summed_rates():
    got = balance.ideal({"worker-0": 1000.0, "worker-1": 500.0}, 300)
    assert got["step_s"] == pytest.approx(0.2) and got["examples_per_s"] == 1500.0
    assert math.isnan(balance.ideal({"worker-0": 0.0}, 300)["step_s"])


def test_the_summary_gives_medians_and_ratios_to_the_ideal():
    sides = {
        "even": [{"step_s": 0.30}, {"step_s": 0.32}, {"step_s": 0.40}],
        "balanced": [{"step_s": 0.22}],
        "parameter_server": [{"step_s": 0.25}],
        "even_pair": [{"step_s": 0.10}],
        "balanced_pair": [{"step_s": 0.11}],
    }
    rates = {"worker-0": [1000.0, 900.0, 1100.0], "worker-1": [500.0]}
    got = balance.summary(sides, rates, 300)
    assert got["ideal"]["step_s"] == pytest.approx(0.2)
    assert got["sides"]["even"]["step_s"] == pytest.approx(0.32)
    assert got["sides"]["even"]["examples_per_s"] == pytest.approx(300 / 0.32)
    assert got["even_ratio"] == pytest.approx(1.6)
    assert got["balanced_ratio"] == pytest.approx(1.1)
    assert got["parameter_server_ratio"] == pytest.approx(1.25)
    assert got["pair_ratio"] == pytest.approx(1.1)
    assert got["balanced_speedup"] == pytest.approx(0.32 / 0.22)
    assert got["balanced_vs_even_ratio"] == pytest.approx(0.22 / 0.32)
    assert set(got["goals"]) == {
        "balanced_ratio",
        "balanced_vs_even_ratio",
        "pair_ratio",
        "pair_changes_per_1000_updates",
    }
    assert "pair_ratio" not in balance.summary(
        {k: sides[k] for k in ("even", "balanced")}, rates, 300
    )


def test_the_plot_is_drawn(tmp_path):
    rows = [
        {"epoch": 1, "end_s": 1.0, "step_s": 0.3, "shares": {"worker:0": 64, "worker:1": 64}},
        {"epoch": 2, "end_s": 2.0, "step_s": 0.2, "shares": {"worker:0": 83, "worker:1": 45}},
    ]
    result = {
        "sides": {"even": {"step_s": 0.3, "epochs": [rows]}, "balanced": {"step_s": 0.2}},
        "ideal": {"step_s": 0.18, "worker_examples_per_s": {"worker-0": 2.0, "worker-1": 1.0}},
        "config": {"global_batch_size": 128, "hog_worker": 1},
    }
    result["sides"]["balanced"]["epochs"] = [rows]
    path = tmp_path / "balance.png"
    plot_balance(result, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"
    plot_balance({"samples": {"workloads": {"convnet": result, "digits": result}}}, str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_a_launch_is_reported_with_its_fit_time_and_split_changes():
    rows = [
        {"epoch": 1, "end_s": 1.0, "step_s": 0.3, "others_cpu": 0.0},
        {"epoch": 2, "end_s": 2.0, "step_s": 0.2, "others_cpu": 0.0},
    ]
    spec = {"settle_epochs": 1, "epochs": 2, "steps_per_epoch": 100}
    got = balance.launch_record(rows, [{"t": 0.5, "line": LINE}], spec)
    assert (got["step_s"], got["fit_s"], got["changes"]) == (0.2, 2.0, 1)
    assert got["changes_per_1000_updates"] == pytest.approx(5.0)


def test_each_workload_is_checked_before_any_launch():
    assert balance.check_workloads("digits, convnet") == ("digits", "convnet")
    with pytest.raises(ValueError, match="Received: workloads='mnist'"):
        balance.run(workloads=("mnist",))
    with pytest.raises(ValueError, match="distinct names"):
        balance.run(workloads=("digits", "digits"))
    with pytest.raises(ValueError, match="`steps_per_execution`"):
        balance.run(steps_per_execution="sometimes")
    assert balance.WORKLOADS["digits"]["steps_per_execution"] == "auto"  # as tfdist train


@pytest.mark.parametrize(
    "sides, match",
    [
        (("even", "balanced", "fastest"), "Received: balance_sides=.fastest."),
        (("even", "parameter_server"), "including even and balanced"),
        (("even", "balanced", "even"), "distinct side names"),
    ],
)
def test_bad_sides_are_refused(sides, match):
    with pytest.raises(ValueError, match=match):
        balance.run(sides=sides)


def test_the_flag_reaches_the_benchmark_and_bad_options_are_refused():
    assert balance.check_sides("even, balanced,even_pair") == ("even", "balanced", "even_pair")
    common.set_options({"balance_sides": ("even",)})
    try:
        with pytest.raises(ValueError, match="`balance_sides`"):
            common.registry()["balance"](1, True)
    finally:
        common.set_options(None)
    with pytest.raises(ValueError, match="`global_batch_size`"):
        balance.run(global_batch_size=63)
    with pytest.raises(ValueError, match="`settle_epochs`"):
        balance.run(settle_epochs=12)
    with pytest.raises(ValueError, match="`window`"):
        balance.run(window=0)
    with pytest.raises(ValueError, match="Received: option=.hog."):
        balance.run(hog=True)
    with pytest.raises(ValueError, match="Received: model='resnet'. Expected one of"):
        balance.run(model="resnet")
    with pytest.raises(ValueError, match="Received: latency_ms=0. Expected a positive number"):
        balance.run(latency_ms=0)


def test_the_latency_sides_and_the_overhead_are_summarised():
    sides = {
        "even": [{"step_s": 0.30}],
        "balanced": [{"step_s": 0.24}],
        "even_pair": [{"step_s": 0.12}],
        "balanced_pair": [{"step_s": 0.12}],
        "even_latency": [{"step_s": 0.20}],
        "balanced_latency": [{"step_s": 0.19}],
    }
    # Worker 0 computes half the global batch of 300 in 0.1 s: the even pair's 0.12 s leaves
    # 0.02 s of exchange and step overhead, which the second ideal adds.
    got = balance.summary(sides, {"worker-0": [1500.0], "worker-1": [500.0]}, 300)
    assert got["latency_ratio"] == pytest.approx(0.95)
    assert got["goals"]["latency_ratio"] == "<= 1.05"
    assert got["ideal"]["overhead_s"] == pytest.approx(0.02)
    assert got["ideal"]["step_s_with_overhead"] == pytest.approx(0.15 + 0.02)
    assert got["balanced_ratio_with_overhead"] == pytest.approx(0.24 / 0.17)
    assert balance.SIDES["even_latency"] == ("balance", False, "latency")


def test_the_delay_layer_waits_and_passes_its_input_on():
    import time

    import numpy as np

    from tfdist.bench.balance.worker import Delay

    x = np.ones((2, 3), "float32")
    np.testing.assert_array_equal(np.asarray(Delay(0.0)(x)), x)  # no delay: no op added
    started = time.perf_counter()
    np.testing.assert_array_equal(np.asarray(Delay(0.05)(x)), x)
    assert time.perf_counter() - started >= 0.05


def test_the_hogs_pid_is_found_at_once_and_its_cpu_read():
    """The hog's CPU counts as its worker's own; read right after its start, it was missed."""
    import os
    import time

    from tfdist.bench.balance import worker as balance_worker

    hog = balance_worker.start_hog(os.sched_getaffinity(0))
    try:
        pid = balance_worker.host_pid(hog)
        assert pid is not None
        before = balance_worker.process_cpu_seconds(pid)
        time.sleep(0.3)
        assert balance_worker.process_cpu_seconds(pid) > before
    finally:
        balance_worker.stop_hog(hog)


def test_each_workloads_headlines_reach_the_summary_table_with_their_goals(monkeypatch):
    from tfdist.bench.harness import cluster_run

    monkeypatch.setattr(cluster_run, "machine", lambda: {"cpu": "test"})
    sides = {"even": [{"step_s": 0.30}], "balanced": [{"step_s": 0.21}]}
    one = balance.summary(sides, {"worker-0": [1000.0], "worker-1": [500.0]}, 300)
    one["others_cpu_max"] = 0.1
    got = balance.headlines({"digits": one})
    assert got["digits_balanced_vs_even_ratio"] == pytest.approx(0.7)
    assert got["goals"]["digits_balanced_vs_even_ratio"] == "<= 0.80"
    assert got["words"]["digits_balanced_ratio"].startswith("digits: hog on worker 1")
    assert got["samples"]["workloads"]["digits"] is one


def _ab_fit(mode, wall_per_update, cpu_per_s, splits=(), round=0):
    """One worker's record of an A/B fit: the fit's start, a first epoch of 5 s (dropped),
    then 2 epochs of 10 updates at ``wall_per_update``."""
    times = [0.0, 5.0, 5.0 + 10 * wall_per_update, 5.0 + 20 * wall_per_update]
    epochs = _epochs(times, cpu_per_s, busy_per_s=3.0)
    return {"mode": mode, "round": round, "epochs": epochs, "splits": list(splits)}


def _ab_launch(even_wall, balanced_wall):
    """An A/B launch's tasks, fits even, balanced, balanced, even; worker 1 spends 0.8 CPU-s
    a second in the balanced fits, 1.0 in the even ones; one split change."""
    order = [("even", even_wall), ("balanced", balanced_wall)] * 2
    order[2:] = order[2:][::-1]
    return {
        "worker-0": {
            "fits": [
                _ab_fit(m, w, 1.0, [{"t": 9.0, "line": LINE}] if i == 1 else (), i // 2)
                for i, (m, w) in enumerate(order)
            ]
        },
        "worker-1": {
            "fits": [
                _ab_fit(m, w, 0.8 if m == "balanced" else 1.0, round=i // 2)
                for i, (m, w) in enumerate(order)
            ]
        },
    }


def test_an_ab_launch_gives_each_modes_median_and_the_ratios():
    from tfdist.bench.balance import ab

    got = ab.launch_record(_ab_launch(0.1, 0.11), steps_per_epoch=10)
    assert [f["mode"] for f in got["fits"]] == ["even", "balanced", "balanced", "even"]
    assert got["modes"]["even"]["wall_s"] == pytest.approx(0.1)
    assert got["modes"]["even"]["cpu_s"] == pytest.approx(0.2)  # both workers' CPU
    assert got["ratio"] == pytest.approx(1.1)
    assert got["cpu_ratio"] == pytest.approx(1.8 * 0.11 / 0.2)
    # 1 change in the balanced fits' 2 x 30 updates (the dropped epoch counts here).
    assert (got["changes"], got["balanced_updates"]) == (1, 60)
    assert got["changes_per_1000_updates"] == pytest.approx(1000 / 60)
    # 3 busy cores less the workers' 2: 1 other core.
    assert got["fits"][0]["others_cpu"] == pytest.approx(1.0)


def test_the_ab_sides_reach_the_summary_table_with_their_goals(monkeypatch):
    from tfdist.bench.balance import ab
    from tfdist.bench.harness import cluster_run

    monkeypatch.setattr(cluster_run, "machine", lambda: {"cpu": "test"})
    launches = [ab.launch_record(_ab_launch(0.1, w), 10) for w in (0.1, 0.11, 0.104)]
    spec = {"sides": ["pair_ab"], "global_batch_size": 256}
    seen = {"steady": {"pair_ab": launches}, "launch_seconds": {"pair_ab": [60.0] * 3}}
    one = balance.workload_summary(spec, seen, {"worker-0": [], "worker-1": []})
    assert one["ab"]["pair_ab"]["ratio_samples"] == pytest.approx([1.0, 1.1, 1.04])
    assert one["pair_ab_ratio"] == pytest.approx(1.04)  # the median launch
    assert one["pair_ab_changes_per_1000_updates"] == pytest.approx(1000 / 60)
    got = balance.headlines({"digits": one})
    assert got["digits_pair_ab_ratio"] == pytest.approx(1.04)
    assert got["goals"]["digits_pair_ab_ratio"] == "<= 1.02"
    assert got["goals"]["digits_pair_ab_changes_per_1000_updates"] == "<= 2"
    assert "digits_loaded_ab_ratio" not in got and "digits_even_ratio" not in got
    assert balance.check_sides("pair_ab,loaded_ab") == ("pair_ab", "loaded_ab")
    with pytest.raises(ValueError, match="Received: ab_epochs=1"):
        balance.run(sides=("pair_ab",), ab_epochs=1)


def _yard_fit(mode, round, clean_times, cpu_per_s, yard_s, yard_cpu):
    """One worker's record of an A/B fit with yardsticks: at each row's mark the yardstick
    measures ``yard_cpu`` and spends ``yard_s`` wall and as much CPU; its clocks are the
    real ones (``clean_times`` plus every yardstick before the row, the longest of the two
    workers' each time, as the next all-reduce waits for it)."""
    rows = []
    for i, t in enumerate(clean_times):
        rows.append(
            {
                "t": t + i * 0.03,  # the slower worker's yardstick: 0.03 s a mark
                "cpu": cpu_per_s * t + i * yard_s,
                "hog_cpu": 0.0,
                "busy_cpu": None,
                "yard_cpu": yard_cpu,
                "yard_spent_s": i * yard_s,
                "yard_spent_cpu": i * yard_s,
            }
        )
    return {"mode": mode, "round": round, "epochs": rows, "splits": []}


def test_an_ab_fit_leaves_the_yardsticks_out_and_counts_its_cpu_in_yardsticks():
    from tfdist.bench.balance import ab

    times = [0.0, 5.0, 6.0, 7.0]  # 2 measured epochs of 10 updates at 0.1 s
    lead = _yard_fit("even", 0, times, 1.0, 0.02, 0.004)
    other = _yard_fit("even", 0, times, 0.5, 0.03, 0.002)
    # Busy: both workers' real CPU (their yardsticks' too) and half a core of others.
    for i, row in enumerate(lead["epochs"]):
        row["busy_cpu"] = row["cpu"] + other["epochs"][i]["cpu"] + 0.5 * times[i]
    got = ab.fit_record([lead, other], steps_per_epoch=10)
    assert got["wall_s"] == pytest.approx(0.1)  # 2 yardsticks of 0.03 s taken out
    assert got["cpu_s"] == pytest.approx((2.0 + 1.0) / 20)  # theirs taken out of each
    assert got["cpu_yards"] == pytest.approx((2.0 / 0.004 + 1.0 / 0.002) / 20)
    assert got["yard_cpu_s"] == pytest.approx([0.004, 0.002])
    assert got["yard_wall_s"] == pytest.approx(0.06)
    assert got["others_cpu"] == pytest.approx(0.5)  # the yardsticks' CPU is the tasks' own
    plain = ab.fit_record([_ab_fit("even", 0.1, 1.0)] * 2, steps_per_epoch=10)
    assert math.isnan(plain["cpu_yards"]) and plain["wall_s"] == pytest.approx(0.1)


def _fit(mode, round, wall_s, cpu_yards=math.nan):
    return {"mode": mode, "round": round, "wall_s": wall_s, "cpu_yards": cpu_yards}


def test_each_balanced_fit_is_paired_with_the_even_fit_beside_it():
    from tfdist.bench.balance import ab

    fits = [
        _fit("even", 0, 0.100, 2.0),
        _fit("balanced", 0, 0.102, 2.2),
        _fit("balanced", 1, 0.110),
        _fit("even", 1, 0.100),
        _fit("even", 2, 0.100),  # its balanced fit missing: no pair
    ]
    got = ab.pairs(fits)
    assert [p["round"] for p in got] == [0, 1]
    assert [p["ratio"] for p in got] == pytest.approx([1.02, 1.1])
    assert got[0]["yard_ratio"] == pytest.approx(1.1) and math.isnan(got[1]["yard_ratio"])
    unnumbered = [dict(f, round=None) for f in fits[:4]]  # paired by position
    assert [p["ratio"] for p in ab.pairs(unnumbered)] == pytest.approx([1.02, 1.1])
    assert ab.mean_se([1.0, 1.1, math.nan]) == pytest.approx((1.05, 0.05, 2))
    assert math.isnan(ab.mean_se([1.0])[1]) and ab.mean_se([])[2] == 0


def test_adjacent_pairs_cancel_a_slow_drift_of_the_host():
    """Equal work on a host 2% slower each fit: the pairs' mean stays at 1."""
    from tfdist.bench.balance import ab

    order = ["even", "balanced", "balanced", "even"] * 2
    fits = [_fit(m, k // 2, 0.1 * (1 + 0.02 * k)) for k, m in enumerate(order)]
    mean, se, n = ab.mean_se([p["ratio"] for p in ab.pairs(fits)])
    assert n == 4 and mean == pytest.approx(1.0, abs=1e-3) and se < 0.02


def test_the_paired_and_yardstick_figures_reach_the_summary_table(monkeypatch):
    from tfdist.bench.balance import ab
    from tfdist.bench.harness import cluster_run

    monkeypatch.setattr(cluster_run, "machine", lambda: {"cpu": "test"})
    launches = [ab.launch_record(_ab_launch(0.1, w), 10) for w in (0.1, 0.11)]
    assert [p["ratio"] for p in launches[1]["pairs"]] == pytest.approx([1.1, 1.1])
    launches[0]["yard_ratio"] = 1.01
    launches[0]["pairs"][0]["yard_ratio"] = 1.03
    figures = ab.side_summary("pair_ab", launches)
    ratios = [1.0, 1.0, 1.1, 1.1]
    assert figures["pair_ab_paired_ratio"] == pytest.approx(1.05)
    se = statistics.stdev(ratios) / 2
    assert figures["pair_ab_paired_ratio_se"] == pytest.approx(se)
    assert figures["pair_ab_paired_yard_ratio"] == pytest.approx(1.03)  # the one known
    assert math.isnan(figures["pair_ab_paired_yard_ratio_se"])
    assert figures["pair_ab_yard_ratio"] == pytest.approx(1.01)  # NaN launches left out
    samples = figures["ab"]["pair_ab"]["paired_ratio_samples"]
    assert [pytest.approx(s) for s in samples] == [[1, 1], [1.1, 1.1]]
    assert figures["ab"]["pair_ab"]["pairs"] == 4
    spec = {"sides": ["pair_ab"], "global_batch_size": 256}
    seen = {"steady": {"pair_ab": launches}, "launch_seconds": {"pair_ab": [60.0] * 2}}
    one = balance.workload_summary(spec, seen, {"worker-0": [], "worker-1": []})
    got = balance.headlines({"digits": one})
    assert got["digits_pair_ab_paired_ratio"] == pytest.approx(1.05)
    assert got["digits_pair_ab_paired_ratio_se"] == pytest.approx(se)
    assert got["goals"]["digits_pair_ab_paired_ratio"] == "<= 1.02"
    assert f"s.e. {se:.3f}" in got["words"]["digits_pair_ab_paired_ratio"]
    assert "digits_pair_ab_yard_ratio" in got and "digits_loaded_ab_paired_ratio" not in got


def test_the_epoch_clock_times_the_yardstick_beside_its_clocks():
    from tfdist.bench.balance import worker as balance_worker

    clock = balance_worker.EpochClock(None, yardstick=True)
    clock.mark()
    clock.mark()
    first, second = clock.rows
    assert (first["yard_spent_s"], first["yard_spent_cpu"]) == (0.0, 0.0)
    assert first["yard_cpu"] > 0 and second["yard_spent_s"] > 0
    assert second["t"] - first["t"] >= second["yard_spent_s"]  # t is the real clock
    plain = balance_worker.EpochClock(None)  # the other sides' clock: no yardstick
    plain.mark()
    assert "yard_cpu" not in plain.rows[0]
