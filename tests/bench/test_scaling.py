"""``tfdist bench --benchmarks=scaling`` at a tiny size, real worker processes: correctness only.

The figures must come from the runs: every side did the same steps and
updates on every worker, rates and efficiencies follow from the recorded
seconds, the measured parts of a step are positive. Nothing here asserts
speed. Each worker gets 1 thread and its own core (2 cores). The all-reduce
benchmark has its own module (test_allreduce.py), so that pytest-xdist
(``--dist loadscope``: one module, one process) can run the two launches at once.
"""

import json
import math
import os
import statistics

import pytest

from tests.bench.checks import PRELOAD, assert_machine_is_this_one, assert_png_written
from tfdist.bench import runner
from tfdist.bench.scaling import parent as scaling

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "bench.json")
    options = {
        "threads_per_worker": 1,
        "scaling_workers": (1, 2),
        "gradient_compression": ("none", "bf16"),
        "preload": PRELOAD,
    }
    results = runner.run(["scaling"], quick=True, output=output, repeats=2, options=options)
    return results, output


def test_every_side_did_the_same_work_on_every_worker(bench_run):
    result = bench_run[0]["results"]["scaling"]
    config = result["config"]
    assert config["threads_per_worker"] == 1 and config["workers"] == [1, 2]
    assert set(result["per_workers"]) == {"1", "2"}
    for n, entry in result["per_workers"].items():
        n = int(n)
        sides = entry["sides"]
        assert {"trainer", "keras_fit", "raw_loop", "raw_loop_bf16", "trainer_ps"} <= set(sides)
        steps = config["steps"]
        for name, side in sides.items():
            assert side["steps_per_measurement"] == steps
            assert side["examples_per_measurement"] == steps * config["per_worker_batch_size"] * n
            assert len(side["examples_per_s_samples"]) == config["repeats"]
            # Counted updates, not requested steps: each measurement made `steps` updates...
            assert side["updates_per_measurement"] == [steps] * config["repeats"], name
            # ...on every worker of the synchronous sides (the PS side counts on the chief).
            expected_tasks = (
                {"chief-0"} if name == "trainer_ps" else {f"worker-{i}" for i in range(n)}
            )
            assert set(side["updates_per_worker"]) == expected_tasks
            assert all(
                u == side["updates_per_measurement"] for u in side["updates_per_worker"].values()
            )
            rates = side["examples_per_s_samples"]
            assert side["examples_per_s"] == pytest.approx(statistics.median(rates))
            assert (
                side["spread"] == pytest.approx(max(rates) / min(rates)) and side["spread"] >= 1.0
            )
            seconds = side["seconds_samples"]
            assert rates == pytest.approx([side["examples_per_measurement"] / s for s in seconds])
            assert side["step_s"] == pytest.approx(statistics.median(seconds) / steps)
        for thread in entry["threads"].values():
            assert thread["intra_op_threads"] == 1
            assert thread["preloaded"]  # forked from the preloaded Python (the preload option)
        workers = {t: v for t, v in entry["threads"].items() if t.startswith("worker")}
        assert len(workers) == n
        if len(os.sched_getaffinity(0)) >= n:  # each worker pinned to its own core
            cpus = [tuple(v["cpus"]) for v in workers.values()]
            assert len(set(cpus)) == n and all(len(c) == 1 for c in cpus)


def test_efficiency_follows_from_the_recorded_rates(bench_run):
    result = bench_run[0]["results"]["scaling"]
    per = result["per_workers"]
    for name, by_count in result["efficiency"].items():
        assert by_count["1"] == pytest.approx(1.0)
        one = per["1"]["sides"][name]["examples_per_s"]
        two = per["2"]["sides"][name]["examples_per_s"]
        assert by_count["2"] == pytest.approx(two / (2 * one))
    top = per["2"]["sides"]
    assert result["ratio"] == pytest.approx(
        top["trainer"]["examples_per_s"] / top["raw_loop"]["examples_per_s"]
    )
    assert result["trainer_vs_keras_fit_ratio"] == pytest.approx(
        top["trainer"]["examples_per_s"] / top["keras_fit"]["examples_per_s"]
    )


def test_step_parts_are_measured_and_positive(bench_run):
    result = bench_run[0]["results"]["scaling"]
    for entry in result["per_workers"].values():
        assert set(entry["parts"]) == {"none", "bf16"}
        for parts in entry["parts"].values():
            for part in ("compute", "exchange", "input"):
                assert _positive(parts[f"{part}_s"])
                assert len(parts["samples"][part]) == result["config"]["repeats"]
            assert parts["sum_s"] == pytest.approx(
                parts["compute_s"] + parts["exchange_s"] + parts["input_s"]
            )
            # The parts, measured apart, add up to the order of a whole raw-loop step (not a
            # timing claim: only that each part is a per-step figure, not per measurement or
            # per call).
            step = entry["sides"]["raw_loop"]["step_s"]
            assert step / 50 < parts["sum_s"] < step * 50


def test_a_trainer_variant_it_lacks_is_reported_unavailable(bench_run):
    result = bench_run[0]["results"]["scaling"]
    import inspect

    import tfdist

    takes = "gradient_compression" in inspect.signature(tfdist.Trainer.__init__).parameters
    for entry in result["per_workers"].values():
        assert ("trainer_bf16" in entry["sides"]) == takes
        assert ("trainer_bf16" in entry["unavailable"]) == (not takes)


def test_results_and_pngs_are_written(bench_run):
    results, output = bench_run
    with open(output) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert_png_written(results, output, "scaling")
    assert_machine_is_this_one(results["results"]["scaling"]["machine"])


def test_bad_scaling_options_get_one_clear_error():
    with pytest.raises(
        ValueError,
        match=r"Invalid value for argument `gradient_compression`. Received: "
        r"gradient_compression='bf8'",
    ):
        scaling.run(gradient_compression=("bf8",))
    with pytest.raises(ValueError, match=r"Invalid value for argument `scaling_workers`"):
        scaling.run(workers=(0, 2))
    with pytest.raises(ValueError, match=r"Invalid value for argument `threads_per_worker`"):
        scaling.run(threads_per_worker=0)


def test_multi_process_benchmarks_run_only_when_named():
    assert {"scaling", "allreduce", "stragglers"} <= set(runner.available())
    assert set(runner.ON_REQUEST) == {
        "scaling",
        "allreduce",
        "stragglers",
        "health",
        "time_to_accuracy",
        "first_fit",
        "memory",
        "pipeline",
        "balance",
        "language_model",
    }


def test_cli_refuses_a_bad_bench_flag_in_one_line():
    from tests.helpers import run_tfdist

    proc = run_tfdist(
        "bench", "--benchmarks=scaling", "--gradient_compression=none,bf8", timeout=120
    )
    assert proc.returncode == 2, proc.stdout
    assert (
        "tfdist bench: error: Invalid value for argument `gradient_compression`. Received: "
        "gradient_compression='bf8'"
    ) in proc.stdout


def test_trainer_variants_pass_only_the_keywords_the_trainer_takes(monkeypatch):
    import tfdist
    from tfdist.bench.scaling import worker as scaling_worker

    class Today:
        def __init__(self, model, *, strategy=None):
            pass

    class WithCompression:
        def __init__(self, model, *, strategy=None, gradient_compression=None, bucket_bytes=None):
            pass

    monkeypatch.setattr(tfdist, "Trainer", Today)
    assert scaling_worker.trainer_kwargs("none", None) == {}
    assert scaling_worker.trainer_kwargs("bf16", None) is None
    assert scaling_worker.trainer_kwargs("none", 1 << 20) is None
    monkeypatch.setattr(tfdist, "Trainer", WithCompression)
    assert scaling_worker.trainer_kwargs("bf16", None) == {"gradient_compression": "bf16"}
    assert scaling_worker.trainer_kwargs("none", 1 << 20) == {"bucket_bytes": 1 << 20}
