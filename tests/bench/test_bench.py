"""``tfdist bench``: one quick run in this process; structure and sanity, no speed assertions.

tests/conftest.py has already split the CPU into 4 virtual devices, so the
bench's ``make_strategy("mirrored", num_devices=2)`` takes 2 of them. The
parameter_server benchmark starts an in-process cluster (2 workers, 1 ps) and
runs last, as it does in ``tfdist bench``.
"""
import json
import math
import os

import pytest

from tfdist.bench import bf16_vs_fp32, common, report, runner, timing

FIT_KEYS = {"trainer_examples_per_s", "keras_fit_examples_per_s", "ratio", "fit_overhead_s", "samples"}
MFU_KEYS = {"matmul_peak_gflops", "trainer_gflops", "keras_fit_gflops", "trainer_mfu", "keras_fit_mfu",
            "mfu_ratio", "goal", "trainer_examples_per_s", "keras_fit_examples_per_s", "config"}
ALL = {"trainer_vs_fit", "mfu", "accumulation", "bf16_vs_fp32", "backup", "parameter_server"}


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "nested" / "bench.json")
    results = runner.run(quick=True, output=output, repeats=2)
    return results, output


def test_writes_the_returned_results_as_json(quick_run):
    results, output = quick_run
    with open(output) as f:
        written = json.load(f)
    assert written == json.loads(json.dumps(results))
    assert set(written) == {"meta", "results"}
    meta = written["meta"]
    for key in ("tensorflow", "keras", "cpu_count", "date", "repeats"):
        assert meta[key] not in (None, "")
    assert meta["repeats"] == 2 and meta["quick"] is True
    # The multi-process ones (scaling, allreduce) run only when named; see test_scaling.py.
    assert set(written["results"]) == set(runner.available()) - set(runner.ON_REQUEST) == ALL
    assert list(written["results"])[-1] == "parameter_server"  # its cluster disables the local strategies


def test_trainer_vs_fit_reports_positive_ratios(quick_run):
    result = quick_run[0]["results"]["trainer_vs_fit"]
    assert FIT_KEYS <= set(result)
    assert result["goal"] == ">= 1.0"
    for pair in (result, result["steps_per_execution_8"]):
        for key in ("trainer_examples_per_s", "keras_fit_examples_per_s", "ratio"):
            assert _positive_finite(pair[key]), (key, pair[key])
        assert pair["ratio"] == pytest.approx(pair["trainer_examples_per_s"] / pair["keras_fit_examples_per_s"])
        assert all(len(v) == 2 for v in pair["samples"]["values"].values())
        # Both sides did the same work: the optimizer updates each timed call really made, counted.
        steps = result["config"]["steps_per_fit"]
        assert pair["updates_per_call"] == {"trainer": [steps, steps], "keras_fit": [steps, steps]}
    assert result["config"]["num_replicas"] == 2


def test_mfu_reports_positive_ratios(quick_run):
    result = quick_run[0]["results"]["mfu"]
    assert MFU_KEYS <= set(result)
    assert result["goal"] == ">= 0.60"
    for key in ("matmul_peak_gflops", "trainer_gflops", "keras_fit_gflops", "trainer_mfu", "keras_fit_mfu",
                "mfu_ratio"):
        assert _positive_finite(result[key]), (key, result[key])
    assert result["trainer_mfu"] == pytest.approx(result["trainer_gflops"] / result["matmul_peak_gflops"])


def test_accumulation_compares_the_same_micro_batches(quick_run):
    result = quick_run[0]["results"]["accumulation"]
    assert result["goal"] == ">= 0.95"
    for key in ("accumulating_examples_per_s", "plain_examples_per_s", "ratio"):
        assert _positive_finite(result[key]), (key, result[key])
    assert result["ratio"] == pytest.approx(result["accumulating_examples_per_s"] / result["plain_examples_per_s"])
    config = result["config"]
    assert config["accumulation_steps"] == {"accumulating": 4, "plain": 1}
    assert config["steps_per_execution"] == 4 and config["num_replicas"] == 2
    # steps_per_epoch counts micro-batches: 4 per update when accumulating, 1 otherwise.
    micro_batches = config["micro_batches_per_fit"]
    assert result["updates_per_fit"] == {"accumulating": micro_batches / 4, "plain": micro_batches}


def test_bf16_vs_fp32_reports_speedups_and_the_cpu_flags(quick_run):
    result = quick_run[0]["results"]["bf16_vs_fp32"]
    assert result["goal"] == ">= 1.5"
    for key in ("float32_step_s", "bf16_step_s", "ratio", "float32_matmul_gflops", "bf16_matmul_gflops",
                "matmul_speedup_ratio", "realised_ratio"):
        assert _positive_finite(result[key]), (key, result[key])
    assert result["ratio"] == pytest.approx(result["float32_step_s"] / result["bf16_step_s"])
    assert result["matmul_speedup_ratio"] == pytest.approx(
        result["bf16_matmul_gflops"] / result["float32_matmul_gflops"])
    assert set(bf16_vs_fp32.BF16_CPU_FLAGS) <= set(result["cpu"])


def test_cpu_features_reads_the_flags_that_are_there(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    features = bf16_vs_fp32.cpu_features(str(cpuinfo))
    assert features["avx512_bf16"] is True and features["amx_tile"] is True and features["amx_bf16"] is False
    assert features["model_name"] == "Some CPU"
    missing = bf16_vs_fp32.cpu_features(str(tmp_path / "absent"))
    assert all(missing[flag] is None for flag in bf16_vs_fp32.BF16_CPU_FLAGS)


def test_parameter_server_compares_trainer_with_hand_written_loops(quick_run):
    result = quick_run[0]["results"]["parameter_server"]
    assert result["goal"] == ">= 0.95"
    bare = result["hand_written_bare_examples_per_s"]
    with_loss = result["hand_written_with_loss_metric_examples_per_s"]
    assert _positive_finite(bare) and _positive_finite(with_loss)
    for pair in (result, result["steps_per_execution_8"]):
        assert _positive_finite(pair["trainer_examples_per_s"]) and _positive_finite(pair["ratio"])
        assert pair["ratio"] == pytest.approx(pair["trainer_examples_per_s"] / bare)
        assert pair["ratio_vs_loop_with_loss_metric"] == pytest.approx(pair["trainer_examples_per_s"] / with_loss)
    sides = {"trainer", "hand_written_bare", "hand_written_with_loss_metric", "trainer_spe8"}
    assert set(result["samples"]["values"]) == sides == set(result["cpu_ms_per_step"])
    assert all(_positive_finite(v) for v in result["cpu_ms_per_step"].values())
    cpu = result["cpu_ms_per_step"]
    assert result["cpu_ratio"] == pytest.approx(cpu["hand_written_bare"] / cpu["trainer"])
    # Every scheduled step reached the variables on the ps, on every side, and the metric's too.
    for name, steps in result["optimizer_steps"].items():
        assert steps["counted"] == steps["expected"] > 0, name
    assert set(result["optimizer_steps"]) == sides
    updates = result["loss_metric_updates"]
    assert updates["counted"] == updates["expected"] == result["optimizer_steps"][
        "hand_written_with_loss_metric"]["expected"]
    config = result["config"]
    assert config["num_workers"] == 2 and config["num_ps"] == 1
    assert config["hand_written_loops"] == {"hand_written_bare": {"loss_metric": None},
                                            "hand_written_with_loss_metric": {"loss_metric": "keras.metrics.Mean"}}


def test_local_strategies_refuse_to_run_after_the_cluster_connected(quick_run):
    assert common.connects_cluster("parameter_server") and not common.connects_cluster("mfu")
    with pytest.raises(RuntimeError, match="parameter_server strategy has connected this process"):
        common.strategy("mirrored")


def test_every_charted_ratio_is_positive_and_finite(quick_run):
    results, output = quick_run
    rows = list(report.ratios(results))
    labels = {label for label, _, _ in rows}
    assert {"trainer_vs_fit.ratio", "trainer_vs_fit.steps_per_execution_8.ratio", "mfu.trainer_mfu",
            "accumulation.ratio", "bf16_vs_fp32.ratio", "bf16_vs_fp32.matmul_speedup_ratio",
            "parameter_server.ratio", "parameter_server.steps_per_execution_8.ratio"} <= labels
    assert all(_positive_finite(value) for _, value, _ in rows)
    assert dict((label, goal) for label, _, goal in rows)["trainer_vs_fit.ratio"] == 1.0
    png = os.path.splitext(output)[0] + ".png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["meta"]["chart"] is None
    else:
        assert results["meta"]["chart"] == png and os.path.getsize(png) > 0


def test_unknown_benchmark_lists_the_valid_names(tmp_path):
    output = tmp_path / "bench.json"
    with pytest.raises(ValueError, match=r"Invalid value for argument `benchmarks`.*'nope'.*"
                                         r"accumulation, allreduce, backup, bf16_vs_fp32, mfu, parameter_server, scaling, "
                                         r"trainer_vs_fit"):
        runner.run(["nope"], output=str(output))
    assert not output.exists()


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="Invalid value for argument `repeats`"):
        runner.run(["mfu"], output=None, repeats=0)


def test_alternate_interleaves_and_reverses_the_order():
    order = []

    def side(name):
        def measure():
            order.append(name)
            return float(len(order)), timing.Timing(1.0, 0.5, None)
        return measure

    samples = timing.alternate({"a": side("a"), "b": side("b"), "c": side("c")}, repeats=3)
    assert order == list("abccbaabc")
    assert samples.values["a"] == [1.0, 6.0, 7.0]
    assert samples.median("c") == 4.0
    assert samples.cpu_share["b"] == [0.5] * 3
    assert all(math.isnan(v) for v in samples.others_cpu["a"])


def _scripted(*measurements):
    """A side that returns (value, Timing) with others_cpu as scripted, one per call."""
    script = iter(measurements)

    def measure():
        value, others_cpu = next(script)
        return value, timing.Timing(1.0, 1.0, others_cpu)

    return measure


def test_alternate_adds_rounds_while_other_processes_make_samples_unclean():
    a = _scripted((1.0, 0.9), (1.0, 0.9), (1.0, 0.9), (2.0, 0.0), (2.0, 0.0))
    b = _scripted(*[(5.0, 0.0)] * 5)
    samples = timing.alternate({"a": a, "b": b}, repeats=3, extra_rounds=3)
    # 3 rounds, all unclean for "a"; 2 extra rounds give it 2 clean ones, a majority of 3.
    assert samples.values["a"] == [1.0, 1.0, 1.0, 2.0, 2.0]
    assert samples.others_cpu["a"] == [0.9, 0.9, 0.9, 0.0, 0.0]
    assert samples.clean("a") == [2.0, 2.0] and samples.median("a") == 2.0
    assert samples.as_dict()["clean"] == {"a": 2, "b": 5}


def test_median_falls_back_to_all_samples_when_none_is_clean():
    samples = timing.alternate({"a": _scripted(*[(3.0, 1.0)] * 3)}, repeats=2, extra_rounds=1)
    assert len(samples.values["a"]) == 3
    assert samples.clean("a") == [] and samples.median("a") == 3.0
