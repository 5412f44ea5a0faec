"""``tfdist bench --benchmarks=stragglers`` at a tiny size, real worker processes: correctness only.

Both sides of each strategy did the same counted work, the delay was injected
on worker 1 as reported and really slowed it (every synchronous step waited
for it; under PS it drew fewer batches), and the ratios follow from the
recorded seconds. Nothing here asserts how fast anything is.
"""

import json
import statistics
import time

import pytest
import tensorflow as tf

from tests.bench.checks import PRELOAD, assert_machine_is_this_one, assert_png_written
from tfdist.bench import runner
from tfdist.bench.harness import common
from tfdist.bench.stragglers import parent as stragglers
from tfdist.bench.stragglers.worker import CALIBRATION_RUNS, straggler_dataset_fn

FACTOR = 4.0


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "bench.json")
    options = {"threads_per_worker": 1, "straggler_factor": FACTOR, "preload": PRELOAD}
    results = runner.run(["stragglers"], quick=True, output=output, repeats=2, options=options)
    return results, output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["multi_worker", "parameter_server"])
def test_both_sides_did_the_same_counted_work(bench_run, strategy):
    result = bench_run[0]["results"]["stragglers"]
    config = result["config"]
    steps, repeats = config["steps"], config["repeats"]
    assert config["factor"] == FACTOR and config["threads_per_worker"] == 1
    sides = result[strategy]["sides"]
    assert set(sides) == {"balanced", "straggler"}
    for name, side in sides.items():
        assert side["examples_per_measurement"] == steps * config["global_batch_size"]
        assert side["updates_per_measurement"] == [steps] * repeats, name
        # MWMS: every worker made the same updates; PS: counted on the chief.
        tasks = {"worker-0", "worker-1"} if strategy == "multi_worker" else {"chief-0"}
        assert set(side["updates_per_worker"]) == tasks
        assert all(u == [steps] * repeats for u in side["updates_per_worker"].values())
        rates = side["examples_per_s_samples"]
        assert rates == pytest.approx(
            [side["examples_per_measurement"] / s for s in side["seconds_samples"]]
        )
        assert side["examples_per_s"] == pytest.approx(statistics.median(rates))
        assert result[f"{strategy}_examples_per_s"][name] == side["examples_per_s"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["multi_worker", "parameter_server"])
def test_the_delay_is_sized_from_the_unslowed_step_and_reported(bench_run, strategy):
    result = bench_run[0]["results"]["stragglers"]
    injected = result["injected"][strategy]
    steps = result["config"]["steps"]
    assert injected["worker"] == "worker-1" and injected["factor"] == FACTOR
    period = 1 if strategy == "multi_worker" else 2  # PS: a worker takes every other step
    assert injected["worker_step_in_cluster_steps"] == period
    assert len(injected["calibration_s"]) == CALIBRATION_RUNS
    unslowed = min(injected["calibration_s"]) / steps * period
    assert injected["unslowed_worker_step_s"] == pytest.approx(unslowed)
    assert injected["seconds_per_batch"] == pytest.approx(FACTOR * unslowed)
    assert injected["seconds_per_batch"] > 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_the_straggler_really_was_slowed(bench_run):
    result = bench_run[0]["results"]["stragglers"]
    steps = result["config"]["steps"]
    # MWMS: every step takes a batch from worker 1, which sleeps before each: a measurement
    # cannot take less than the sleeps (less a batch or two its pipeline may hold ready).
    delay = result["injected"]["multi_worker"]["seconds_per_batch"]
    for seconds in result["multi_worker"]["sides"]["straggler"]["seconds_samples"]:
        assert seconds >= (steps - 2) * delay
    # PS: closures go to whichever worker is free; the sleeping worker drew fewer batches.
    drawn = result["parameter_server"]["batches_drawn_per_worker"]
    assert set(drawn) == {"balanced", "straggler"}
    for counts in drawn.values():
        assert set(counts) == {"worker-0", "worker-1"} and sum(counts.values()) == steps
    assert drawn["straggler"]["worker-1"] < drawn["straggler"]["worker-0"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ratios_follow_from_the_rates(bench_run):
    result = bench_run[0]["results"]["stragglers"]
    for strategy in ("multi_worker", "parameter_server"):
        rates = result[f"{strategy}_examples_per_s"]
        assert result[f"{strategy}_ratio"] == pytest.approx(rates["straggler"] / rates["balanced"])
        sides = result[strategy]["sides"]
        assert result[f"{strategy}_added_step_s"] == pytest.approx(
            sides["straggler"]["step_s"] - sides["balanced"]["step_s"]
        )
        period = result["injected"][strategy]["worker_step_in_cluster_steps"]
        period *= sides["balanced"]["step_s"]
        effective = max(1.0, result["injected"][strategy]["seconds_per_batch"] / period)
        assert result[f"{strategy}_effective_factor"] == pytest.approx(effective)
    assert result["multi_worker_expected_ratio"] == pytest.approx(
        1 / result["multi_worker_effective_factor"]
    )
    assert result["parameter_server_expected_ratio"] == pytest.approx(
        (1 + 1 / result["parameter_server_effective_factor"]) / 2
    )
    assert result["expected_sync_ratio"] == pytest.approx(1 / FACTOR)
    assert result["expected_independent_ratio"] == pytest.approx((1 + 1 / FACTOR) / 2)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_results_and_png_are_written(bench_run):
    results, output = bench_run
    with open(output) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert_png_written(results, output, "stragglers")
    assert_machine_is_this_one(results["results"]["stragglers"]["machine"])


def _seconds_to_read(dataset, n):
    iterator = iter(dataset)
    next(iterator)  # the pipeline's start-up is not what is measured
    start = time.perf_counter()
    for _ in range(n):
        next(iterator)
    return time.perf_counter() - start


def test_only_the_straggler_pipeline_sleeps_before_each_batch():
    import tfdist

    base = tfdist.data.load("digits", split="train").bind(global_batch_size=8)
    delay = 0.2
    fn = straggler_dataset_fn(
        base, delay_s=delay, straggler=1, worker_index=lambda ctx: ctx.input_pipeline_id
    )
    slow = _seconds_to_read(fn(tf.distribute.InputContext(2, 1, 2)), 3)
    fast = _seconds_to_read(fn(tf.distribute.InputContext(2, 0, 2)), 3)
    # The pipeline may start the next sleep before the first read returns, so a
    # margin under 3 sleeps; the fast pipeline does not sleep at all.
    assert slow >= 2.5 * delay
    assert fast < delay
    # Same batches as the pipeline without the sleep.
    plain = next(iter(base(tf.distribute.InputContext(2, 1, 2))))
    slept = next(iter(fn(tf.distribute.InputContext(2, 1, 2))))
    assert plain[0].shape == slept[0].shape and plain[1].dtype == slept[1].dtype


def test_a_bad_straggler_factor_gets_one_clear_error():
    with pytest.raises(
        ValueError,
        match=r"Invalid value for argument `straggler_factor`. Received: straggler_factor=0.5",
    ):
        stragglers.run(factor=0.5)
    # The flag reaches the benchmark under its flag name.
    common.set_options({"straggler_factor": 0.5})
    try:
        with pytest.raises(ValueError, match="`straggler_factor`"):
            common.registry()["stragglers"](2, True)
    finally:
        common.set_options(None)
