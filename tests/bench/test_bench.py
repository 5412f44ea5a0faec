"""``tfdist bench``: one quick run in this process; its figures must come from the runs.

tests/conftest.py has already split the CPU into 4 virtual devices, so the
bench's ``make_strategy("mirrored", num_devices=2)`` takes 2 of them. The
parameter_server benchmark starts an in-process cluster (2 workers, 1 ps) and
runs last, as it does in ``tfdist bench``.
"""

import json
import math
import os
import statistics

import pytest

from tests.bench.checks import cpuinfo_first
from tfdist.bench import names, runner
from tfdist.bench.harness import common, report, timing
from tfdist.bench.in_process import bf16_vs_fp32

FIT_KEYS = {
    "trainer_examples_per_s",
    "keras_fit_examples_per_s",
    "ratio",
    "fit_overhead_s",
    "samples",
}
MFU_KEYS = {
    "matmul_peak_gflops",
    "trainer_gflops",
    "keras_fit_gflops",
    "trainer_mfu",
    "keras_fit_mfu",
    "mfu_ratio",
    "goal",
    "trainer_examples_per_s",
    "keras_fit_examples_per_s",
    "config",
}
ALL = set(names.IN_PROCESS)  # the one registry's; the names themselves are pinned below


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _from_samples(reported, samples, name):
    """``reported`` is a middle value of side ``name``'s own measurements, not taken from elsewhere.

    Which samples count (clean ones) and how they are combined (median) is the timing module's
    job, tested with known values in test_timing.py.
    """
    values = samples["values"][name]
    assert min(values) <= reported <= max(values) or reported == pytest.approx(min(values)), name
    return True


def _check_samples(samples, name, *, work, repeats=2):
    """Side ``name`` measured >= ``repeats`` times, each value = ``work`` / its recorded seconds."""
    values, seconds = samples["values"][name], samples["seconds"][name]
    assert len(values) == len(seconds) >= repeats  # more when other processes disturbed some
    assert all(_positive_finite(s) for s in seconds)
    assert values == pytest.approx([work / s for s in seconds]), name
    busy = samples["others_cpu"][name]
    assert samples["clean"][name] == sum(b is None or b <= timing.BUSY_CPU for b in busy)


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
    assert meta["cpu_count"] == os.cpu_count()
    # The multi-process ones (scaling, allreduce, stragglers) run only when named.
    assert set(written["results"]) == set(runner.available()) - set(runner.ON_REQUEST) == ALL
    assert (
        list(written["results"])[-1] == "parameter_server"
    )  # its cluster disables the local strategies


def test_trainer_vs_fit_figures_come_from_equal_runs(quick_run):
    result = quick_run[0]["results"]["trainer_vs_fit"]
    assert FIT_KEYS <= set(result)
    config = result["config"]
    steps, batch = config["steps_per_fit"], config["global_batch_size"]
    assert config["num_replicas"] == 2
    for pair in (result, result["steps_per_execution_8"]):
        samples = pair["samples"]
        for side in ("trainer", "keras_fit"):
            # Every value is the same work (steps x global batch) over its call's seconds...
            _check_samples(samples, side, work=steps * batch)
            # ...the reported rate is the median of the clean ones...
            assert _from_samples(pair[f"{side}_examples_per_s"], samples, side)
            # ...and each timed call made exactly `steps` optimizer updates, counted, on both sides.
            assert pair["updates_per_call"][side] == [steps] * len(samples["values"][side])
        assert pair["ratio"] == pytest.approx(
            pair["trainer_examples_per_s"] / pair["keras_fit_examples_per_s"]
        )
    assert result["steps_per_execution"] == 1
    assert result["steps_per_execution_8"]["steps_per_execution"] == 8


def test_mfu_counts_the_mlps_flops_and_its_own_peak(quick_run):
    result = quick_run[0]["results"]["mfu"]
    assert MFU_KEYS <= set(result)
    config = result["config"]
    # 6 FLOPs per multiply-add of every Dense kernel, counted from the config by hand.
    widths = [*config["input_shape"], *config["hidden_units"], config["num_classes"]]
    flops = 6 * sum(a * b for a, b in zip(widths, widths[1:]))
    assert config["flops_per_example"] == flops
    samples, matmul = result["samples"], config["matmul"]
    _check_samples(samples, "matmul", work=2 * matmul["n"] ** 3 * matmul["iterations"] / 1e9)
    assert _from_samples(result["matmul_peak_gflops"], samples, "matmul")
    steps, batch = config["steps_per_fit"], config["global_batch_size"]
    for side in ("trainer", "keras_fit"):
        _check_samples(samples, side, work=steps * batch)
        rate = result[f"{side}_examples_per_s"]
        assert _from_samples(rate, samples, side)
        assert result[f"{side}_gflops"] == pytest.approx(flops * rate / 1e9)
        peak = result["matmul_peak_gflops"]
        assert result[f"{side}_mfu"] == pytest.approx(flops * rate / 1e9 / peak)
    assert result["mfu_ratio"] == pytest.approx(result["trainer_mfu"] / result["keras_fit_mfu"])


def test_accumulation_compares_the_same_micro_batches(quick_run):
    result = quick_run[0]["results"]["accumulation"]
    config = result["config"]
    assert config["accumulation_steps"] == {"accumulating": 4, "plain": 1}
    assert config["steps_per_execution"] == 4 and config["num_replicas"] == 2
    micro_batches, batch = config["micro_batches_per_fit"], config["global_batch_size"]
    samples = result["samples"]
    for side, k in config["accumulation_steps"].items():
        # Both sides train on the same micro-batches per call; examples/s counts them all...
        _check_samples(samples, side, work=micro_batches * batch)
        assert _from_samples(result[f"{side}_examples_per_s"], samples, side)
        # ...and the updates each call really made differ by the accumulation factor.
        calls = len(samples["values"][side])
        assert result["updates_per_call"][side] == [micro_batches // k] * calls
    assert result["updates_per_fit"] == {"accumulating": micro_batches / 4, "plain": micro_batches}
    assert result["ratio"] == pytest.approx(
        result["accumulating_examples_per_s"] / result["plain_examples_per_s"]
    )


def test_bf16_vs_fp32_trains_in_both_precisions_and_reads_the_cpu(quick_run):
    result = quick_run[0]["results"]["bf16_vs_fp32"]
    config = result["config"]
    # The two sides really computed in different dtypes, with the same number of updates.
    assert result["compute_dtypes"] == {
        "float32": ["float32"],
        "mixed_bfloat16": ["bfloat16", "float32"],
    }
    steps, batch = config["steps_per_fit"], config["global_batch_size"]
    samples = result["samples"]
    for side, key in (("float32", "float32"), ("mixed_bfloat16", "bf16")):
        _check_samples(samples, side, work=steps * batch)
        assert result["updates_per_call"][side] == [steps] * len(samples["values"][side])
        rate = result[f"{key}_examples_per_s"]
        assert _from_samples(rate, samples, side)
        assert result[f"{key}_step_s"] == pytest.approx(batch / rate)
    matmul = config["matmul"]
    for side, key in (("float32_matmul", "float32"), ("bfloat16_matmul", "bf16")):
        _check_samples(samples, side, work=2 * matmul["n"] ** 3 * matmul["iterations"] / 1e9)
        assert _from_samples(result[f"{key}_matmul_gflops"], samples, side)
    assert result["ratio"] == pytest.approx(result["float32_step_s"] / result["bf16_step_s"])
    assert result["realised_ratio"] == pytest.approx(
        result["ratio"] / result["matmul_speedup_ratio"]
    )
    # The CPU block is this machine's /proc/cpuinfo, read apart from the bench here.
    flags = cpuinfo_first("flags")
    flags = None if flags is None else set(flags.split())
    assert {flag: result["cpu"][flag] for flag in bf16_vs_fp32.BF16_CPU_FLAGS} == {
        flag: None if flags is None else flag in flags for flag in bf16_vs_fp32.BF16_CPU_FLAGS
    }
    assert result["cpu"]["model_name"] == cpuinfo_first("model name")


def test_cpu_features_reads_the_flags_that_are_there(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    features = bf16_vs_fp32.cpu_features(str(cpuinfo))
    assert (
        features["avx512_bf16"] is True
        and features["amx_tile"] is True
        and features["amx_bf16"] is False
    )
    assert features["avx2"] is True and features["avx512f"] is False
    assert features["model_name"] == "Some CPU"
    missing = bf16_vs_fp32.cpu_features(str(tmp_path / "absent"))
    assert all(
        missing[flag] is None
        for flag in (*bf16_vs_fp32.BF16_CPU_FLAGS, *bf16_vs_fp32.VECTOR_CPU_FLAGS)
    )


def test_backup_sides_did_the_same_updates_and_the_cost_follows(quick_run):
    result = quick_run[0]["results"]["backup"]
    config = result["config"]
    steps, batch = config["updates_per_fit"], config["global_batch_size"]
    freq = config["backup_freq"]
    assert (steps, freq, config["slow_fsync_ms"]) == (8, 2, 0)
    samples = result["samples"]
    sides = ("asynchronous", "synchronous", "no_backup")
    assert set(samples["values"]) == set(sides)
    for side in sides:
        _check_samples(samples, side, work=steps * batch)
        assert result["updates_per_call"][side] == [steps] * len(samples["values"][side])
        assert _from_samples(result[f"{side}_examples_per_s"], samples, side)
    examples = steps * batch
    seconds = {side: examples / result[f"{side}_examples_per_s"] for side in sides}
    whole = {side: examples / (seconds[side] + result["fit_overhead_s"][side]) for side in sides}
    for side, prefix in (("asynchronous", ""), ("synchronous", "synchronous_")):
        assert result[f"{prefix}ratio"] == pytest.approx(seconds["no_backup"] / seconds[side])
        paired = [a / b for a, b in zip(samples["values"][side], samples["values"]["no_backup"])]
        assert result[f"{prefix}paired_ratio"] == pytest.approx(statistics.median(paired))
        extra = seconds[side] - seconds["no_backup"]
        # 3 in-epoch backups (after updates 2, 4, 6; the epoch-end one is not in the steps' time).
        assert result["seconds_per_backup"][side] == pytest.approx(extra / 3)
        assert result[f"{prefix}ratio_whole_call"] == pytest.approx(
            whole[side] / whole["no_backup"]
        )
    assert result["max_updates_lost_per_kill"] == {"asynchronous": 2 * freq, "synchronous": freq}


def test_the_backup_bench_checks_its_slow_disk():
    from tfdist.bench.in_process import backup

    common.set_options({"slow_fsync_ms": -1})
    try:
        with pytest.raises(
            ValueError, match=r"argument `slow_fsync_ms`. Received: slow_fsync_ms=-1"
        ):
            backup.backup(repeats=1, quick=True)
    finally:
        common.set_options(None)


def test_parameter_server_compares_trainer_with_hand_written_loops(quick_run):
    result = quick_run[0]["results"]["parameter_server"]
    config = result["config"]
    steps, batch = config["steps_per_run"], config["global_batch_size"]
    samples = result["samples"]
    sides = {
        "trainer",
        "hand_written_bare",
        "hand_written_with_loss_metric",
        "trainer_spe8",
        "trainer_progress_bar",
    }
    assert set(samples["values"]) == sides == set(result["cpu_ms_per_step"])
    rates = {
        "hand_written_bare": result["hand_written_bare_examples_per_s"],
        "hand_written_with_loss_metric": result["hand_written_with_loss_metric_examples_per_s"],
        "trainer": result["trainer_examples_per_s"],
        "trainer_spe8": result["steps_per_execution_8"]["trainer_examples_per_s"],
        "trainer_progress_bar": result["progress_bar"]["trainer_examples_per_s"],
    }
    for side in sides:
        _check_samples(samples, side, work=steps * batch)
        assert _from_samples(rates[side], samples, side)
    for pair, side in (
        (result, "trainer"),
        (result["steps_per_execution_8"], "trainer_spe8"),
        (result["progress_bar"], "trainer_progress_bar"),
    ):
        assert pair["ratio"] == pytest.approx(rates[side] / rates["hand_written_bare"])
        assert pair["ratio_vs_loop_with_loss_metric"] == pytest.approx(
            rates[side] / rates["hand_written_with_loss_metric"]
        )
    assert all(_positive_finite(v) for v in result["cpu_ms_per_step"].values())
    cpu = result["cpu_ms_per_step"]
    assert result["cpu_ratio"] == pytest.approx(cpu["hand_written_bare"] / cpu["trainer"])
    # Every scheduled step reached the variables on the ps, on every side (warm-up call included),
    # and the loss metric's too.
    for name, counted in result["optimizer_steps"].items():
        calls = 1 + len(samples["values"][name])
        assert counted["counted"] == counted["expected"] == calls * steps, name
    assert set(result["optimizer_steps"]) == sides
    updates = result["loss_metric_updates"]
    assert (
        updates["counted"]
        == updates["expected"]
        == result["optimizer_steps"]["hand_written_with_loss_metric"]["expected"]
    )
    assert config["num_workers"] == 2 and config["num_ps"] == 1
    assert config["hand_written_loops"] == {
        "hand_written_bare": {"loss_metric": None},
        "hand_written_with_loss_metric": {"loss_metric": "keras.metrics.Mean"},
    }


def test_local_strategies_refuse_to_run_after_the_cluster_connected(quick_run):
    assert common.connects_cluster("parameter_server") and not common.connects_cluster("mfu")
    with pytest.raises(RuntimeError, match="parameter_server strategy has connected this process"):
        common.strategy("mirrored")


def test_every_charted_ratio_is_positive_and_finite(quick_run):
    results, output = quick_run
    rows = list(report.ratios(results))
    labels = {label for label, _, _ in rows}
    assert {
        "trainer_vs_fit.ratio",
        "trainer_vs_fit.steps_per_execution_8.ratio",
        "mfu.trainer_mfu",
        "accumulation.ratio",
        "bf16_vs_fp32.ratio",
        "bf16_vs_fp32.matmul_speedup_ratio",
        "parameter_server.ratio",
        "parameter_server.steps_per_execution_8.ratio",
    } <= labels
    assert all(_positive_finite(value) for _, value, _ in rows)
    # Each result's stated goal (">= x") is the line its ratio is charted against.
    charted = {label: goal for label, _, goal in rows}
    for name, result in results["results"].items():
        if f"{name}.ratio" in charted:
            assert result["goal"].startswith(">= "), name
            assert float(result["goal"][3:]) == charted[f"{name}.ratio"], name
    png = os.path.splitext(output)[0] + ".png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert results["meta"]["chart"] is None
    else:
        assert results["meta"]["chart"] == png and os.path.getsize(png) > 0


def test_unknown_benchmark_lists_the_valid_names(tmp_path):
    # The names written out: ``--benchmarks`` names and JSON keys must not change.
    output = tmp_path / "bench.json"
    with pytest.raises(
        ValueError,
        match=r"Invalid value for argument `benchmarks`.*'nope'.*"
        r"accumulation, allreduce, backup, balance, bf16_vs_fp32, first_fit, health, "
        r"language_model, memory, mfu, parameter_server, pipeline, scaling, sparse_exchange, "
        r"stragglers, time_to_accuracy, trainer_vs_fit",
    ):
        runner.run(["nope"], output=str(output))
    assert not output.exists()


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="Invalid value for argument `repeats`"):
        runner.run(["mfu"], output=None, repeats=0)


def test_the_summary_table_shows_every_figure_of_the_json_with_its_goal(quick_run):
    results, output = quick_run
    with open(output) as f:
        written = json.load(f)
    text = report.summary(written, written["meta"]["files"])
    lines = text.splitlines()
    assert written["meta"]["machine"] in lines[0]
    figures = list(report.figures(written))
    assert len(figures) == len(list(report.ratios(results))) > 0
    for figure in figures:
        row = [
            line
            for line in lines
            if line.startswith(figure["benchmark"] + " ") and f"  {figure['words']}  " in line
        ]
        assert len(row) == 1, (figure, text)
        cells = row[0].split()
        shown = float(next(c for c in cells if c.replace(".", "", 1).isdigit()))
        assert shown == pytest.approx(figure["value"], abs=5e-4, rel=1e-3), (shown, figure)
        if figure["goal"] is not None:
            bound = float(figure["goal"].split()[1])
            met = figure["value"] >= bound if figure["goal"][0] == ">" else figure["value"] <= bound
            assert f"{figure['goal']}" in row[0] and row[0].endswith("yes" if met else "NO")
    # Every file written is named, the JSON first; the chart labels its bars in words.
    assert written["meta"]["files"][0] == output
    assert all(os.path.exists(p) for p in written["meta"]["files"])
    assert lines[-len(written["meta"]["files"]) :] == [
        f"wrote {p}" for p in written["meta"]["files"]
    ]
    assert report.describe("trainer_vs_fit", ["ratio"]) == (
        "Trainer.fit / Keras model.fit, examples/s"
    )
    assert report.describe("trainer_vs_fit", ["steps_per_execution_8", "ratio"]).startswith(
        "steps per execution 8: Trainer.fit"
    )


def test_sparse_exchange_sends_rows_and_keeps_the_weights(quick_run):
    """An embedding's rows gathered send a tenth of its dense gradient's bytes or less (a
    batch touches 2% of 32k rows), and SGD gives the dense exchange's weights."""
    result = quick_run[0]["results"]["sparse_exchange"]
    sent = result["bytes_per_update"]
    assert 0 < sent["rows"] <= 0.10 * sent["dense"]
    assert result["bytes_ratio"] == pytest.approx(sent["rows"] / sent["dense"])
    assert result["max_weight_difference"] < 1e-5
    _check_samples(result["samples"], "rows", work=8 * 64)


def test_bench_tasks_import_this_checkouts_tfdist_first():
    """The tasks' PYTHONPATH starts at the directory holding the ``tfdist`` package (not the
    package itself, where ``import config`` would find tfdist's own module)."""
    from tfdist.bench.harness import cluster_run

    first = cluster_run.task_env(None)["PYTHONPATH"].split(os.pathsep)[0]
    assert os.path.isfile(os.path.join(first, "tfdist", "__init__.py")), first
