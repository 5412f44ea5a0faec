"""``tfdist bench --benchmarks=health`` at a tiny size, 2 real MWMS workers: correctness only.

Every side did the same counted work on both workers; the *off* side really
ran without the health thread and the step clock and the *on* sides with them
(observed during each measured fit, on each worker); the chief scored straggler
rounds during the *on_fast* measurements; the ratios and the per-step cost follow
from the recorded seconds. Nothing here asserts how fast anything is.
"""

import json
import statistics

import pytest

from tests.bench.checks import PRELOAD, assert_machine_is_this_one, assert_png_written
from tfdist.bench import runner
from tfdist.bench.health import parent as health

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
WORKERS = ("worker-0", "worker-1")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "bench.json")
    options = {"threads_per_worker": 1, "preload": PRELOAD}
    results = runner.run(["health"], quick=True, output=output, repeats=2, options=options)
    return results, output


def test_every_side_did_the_same_counted_work(bench_run):
    result = bench_run[0]["results"]["health"]
    config = result["config"]
    steps, repeats = config["steps"], config["repeats"]
    assert config["threads_per_worker"] == 1 and repeats == 2
    assert config["global_batch_size"] == 2 * config["per_worker_batch_size"]
    assert set(result["sides"]) == {"off", "on", "on_fast"}
    for name, side in result["sides"].items():
        assert side["examples_per_measurement"] == steps * config["global_batch_size"]
        assert side["updates_per_measurement"] == [steps] * repeats, name
        assert side["updates_per_worker"] == {w: [steps] * repeats for w in WORKERS}
        rates = side["examples_per_s_samples"]
        assert rates == pytest.approx(
            [side["examples_per_measurement"] / s for s in side["seconds_samples"]]
        )
        assert side["examples_per_s"] == pytest.approx(statistics.median(rates))
        assert result["examples_per_s"][name] == side["examples_per_s"]
    for thread in result["threads"].values():
        assert thread["intra_op_threads"] == 1
        assert thread["preloaded"]


def test_the_on_sides_really_ran_the_health_thread_and_the_clock(bench_run):
    result = bench_run[0]["results"]["health"]
    repeats = result["config"]["repeats"]
    observed = result["observed"]
    assert set(observed) == set(WORKERS) and result["chief"] == ["worker-0"]
    for worker in WORKERS:
        # "on" is the Trainer's defaults: the watchdog and the straggler report (the clock).
        for name, thread, clock in (
            ("off", False, False),
            ("on", True, True),
            ("on_fast", True, True),
        ):
            seen = observed[worker][name]
            assert len(seen) == repeats
            for fit in seen:
                assert fit["health_thread"] is thread and fit["step_clock_enabled"] is clock, (
                    worker,
                    name,
                )
                # Warnings are not checked: under the whole suite on 2 cores a pinned worker shares
                # its core with other tests, and is then really slower (the quiet balanced case is
                # tests/training/health/test_watchdog_faults.py's).
    # The chief scored rounds in every fast measurement (both workers published their sums),
    # and none without the report; only the chief scores.
    assert all(fit["rounds_scored"] >= 1 for fit in observed["worker-0"]["on_fast"])
    assert all(fit["rounds_scored"] == 0 for fit in observed["worker-0"]["off"])
    assert all(fit["rounds_scored"] == 0 for w in WORKERS[1:] for fit in observed[w]["on_fast"])
    assert result["last_scores"].startswith("Straggler scores: worker:0 ")
    assert "worker:1 " in result["last_scores"]


def test_ratios_and_step_cost_follow_from_the_samples(bench_run):
    result = bench_run[0]["results"]["health"]
    sides = result["sides"]
    off = sides["off"]
    for name, prefix in (("on", ""), ("on_fast", "on_fast_")):
        rates = result["examples_per_s"]
        assert result[f"{prefix}ratio"] == pytest.approx(rates[name] / rates["off"])
        paired = [
            a / b
            for a, b in zip(sides[name]["examples_per_s_samples"], off["examples_per_s_samples"])
        ]
        assert result[f"{prefix}paired_samples"] == pytest.approx(paired)
        assert result[f"{prefix}paired_ratio"] == pytest.approx(statistics.median(paired))
        others = result["others_cpu_samples"]
        clean = [
            p
            for p, a, b in zip(paired, others[name], others["off"])
            if a is not None and b is not None and max(a, b) <= 0.25
        ]
        assert result[f"{prefix}clean_rounds"] == len(clean)
        if clean:
            assert result[f"{prefix}clean_paired_ratio"] == pytest.approx(statistics.median(clean))
        else:
            assert result[f"{prefix}clean_paired_ratio"] is None
        assert result[f"{prefix}step_cost_ms"] == pytest.approx(
            1e3 * (sides[name]["step_s"] - off["step_s"])
        )
        assert result[f"{prefix}step_cost_fraction"] == pytest.approx(
            sides[name]["step_s"] / off["step_s"] - 1
        )
    assert result["goal"] == ">= 0.99"
    assert result["shortest_measurement_s"] == pytest.approx(
        min(s for side in sides.values() for s in side["seconds_samples"])
    )


def test_results_and_png_are_written(bench_run):
    results, output = bench_run
    with open(output) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert_png_written(results, output, "health")
    assert_machine_is_this_one(results["results"]["health"]["machine"])


def test_bad_health_options_get_one_clear_error():
    with pytest.raises(ValueError, match=r"Invalid value for argument `threads_per_worker`"):
        health.run(threads_per_worker=0)
    with pytest.raises(ValueError, match=r"Invalid value for argument `fast_interval`"):
        health.run(fast_interval=0)
    with pytest.raises(ValueError, match=r"Invalid value for argument `option`"):
        health.run(interval=1.0)
    assert "health" in runner.ON_REQUEST and "health" in runner.available()
