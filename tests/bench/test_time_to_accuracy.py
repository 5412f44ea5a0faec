"""The time-to-accuracy and first-fit benchmarks at a tiny size, real processes: correctness only.

``tfdist bench --benchmarks=time_to_accuracy,first_fit --quick``, one run that the
module's tests share (the suite is CPU-bound: one runner, one module).

time_to_accuracy: one process on one_device and 2 MWMS workers, running the "patterns" task
(the convnet on tiny generated images; ``--time_to_accuracy_tasks=patterns``), each LR rule
once: every side saw the same examples per epoch from the same per-worker batch; the two
workers saw the same accuracies; each fit stopped at the first epoch that reached the task's
target (or ran every epoch); the times, rates, medians and ratios follow from the recorded points;
the *linear* side really trained at the scaled, warmed-up rate and *none* at the base rate.
The 2-worker launch also runs side ``alone`` (worker 0 by itself on one_device, worker 1
waiting): it trained as the 1-worker launch's *none* side did, and worker 1 waited on no CPU.

first_fit: one default 2-worker launch (the launcher pins the workers): every fit (the
Trainer's, then Keras's own `model.fit`'s as the reference) and
every measurement made exactly the updates asked, on both workers; both workers ended
each side with the same weights; the first-fit and Trainer / raw-loop figures follow
from the recorded seconds. Nothing here asserts how fast anything is.
"""

import json
import os
import statistics

import pytest

import tfdist
from tests.bench.checks import PRELOAD, assert_machine_is_this_one, assert_png_written
from tfdist.bench import runner
from tfdist.bench.first_fit import parent as first_fit
from tfdist.bench.harness import common
from tfdist.bench.time_to_accuracy import parent as time_to_accuracy

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
RULES = ("none", "linear")
# One task, to keep the launch cheap: the compute-bound one, at a tiny size. The digits task
# runs the same code on `tfdist train`'s default model and data (tests/test_cli.py runs those).
TASKS = ("patterns",)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "bench.json")
    options = {
        "threads_per_worker": 1,
        "preload": PRELOAD,
        "time_to_accuracy_tasks": TASKS,
        "time_to_accuracy_alone": True,  # side alone in the 2-worker launch: one extra quick fit
    }
    results = runner.run(
        ["time_to_accuracy", "first_fit"], quick=True, output=output, repeats=1, options=options
    )
    return results, output


def _runs(task):
    for n, entry in task["per_workers"].items():
        for rule in RULES:
            for run in entry["sides"][rule]["runs"]:
                yield n, entry, rule, run


def _tasks(bench_run):
    result = bench_run[0]["results"]["time_to_accuracy"]
    assert tuple(result["tasks"]) == TASKS == tuple(result["config"]["tasks"])
    return result, result["tasks"].items()


def test_every_side_saw_the_same_examples_per_epoch(bench_run):
    result, tasks = _tasks(bench_run)
    assert result["config"]["threads_per_worker"] == 1 and result["config"]["repeats"] == 1
    for name, task in tasks:
        config = task["config"]
        b = config["per_worker_batch_size"]
        assert (config["dataset"], config["model"]) == {
            "digits": ("digits", "cnn"),
            "patterns": ("patterns", "convnet"),
        }[name]
        one, two = task["per_workers"]["1"], task["per_workers"]["2"]
        assert (one["strategy"], one["num_workers"], one["global_batch_size"]) == (
            "one_device",
            1,
            b,
        )
        assert (two["strategy"], two["num_workers"], two["global_batch_size"]) == (
            "multi_worker",
            2,
            2 * b,
        )
        for entry in (one, two):
            gbs = entry["global_batch_size"]
            assert entry["updates_per_epoch"] == entry["train_examples"] // gbs
            assert entry["examples_per_epoch"] == entry["updates_per_epoch"] * gbs
            assert all(t["intra_op_threads"] == 1 for t in entry["threads"].values())
            assert all(t["preloaded"] for t in entry["threads"].values())
        # Both train splits divide into whole batches of 32 and 64 alike.
        assert one["examples_per_epoch"] == two["examples_per_epoch"]
        assert one["parameters"] == two["parameters"] > 0
        assert two["chief"] == ["worker-0"] and set(two["threads"]) == {"worker-0", "worker-1"}
        for n, entry, rule, run in _runs(task):
            curve = run["curve"]
            assert [p["epoch"] for p in curve] == list(range(1, len(curve) + 1))
            # Optimizer updates counted after each epoch: whole epochs of the global batch.
            assert [p["updates"] for p in curve] == [
                p["epoch"] * entry["updates_per_epoch"] for p in curve
            ], (name, n, rule)
            assert 1 <= run["epochs_run"] == len(curve) <= config["max_epochs"]
        for rule in RULES:
            per_worker = two["sides"][rule]["val_accuracy_per_worker"]
            assert per_worker["worker-0"] == per_worker["worker-1"], (name, rule)


def _check_fit(run, entry, target, max_epochs):
    curve = run["curve"]
    hits = [p for p in curve if p["val_accuracy"] >= target]
    assert run["reached"] is bool(hits)
    if hits:
        # It stopped at the first epoch at the target.
        assert hits[0] == curve[-1]
        assert run["epochs_to_target"] == run["epochs_run"] == curve[-1]["epoch"]
        assert run["seconds_to_target"] == curve[-1]["seconds"]
        assert run["wall_seconds_to_target"] == curve[-1]["wall_seconds"]
        assert run["updates_to_target"] == curve[-1]["updates"]
        assert run["examples_to_target"] == curve[-1]["epoch"] * entry["examples_per_epoch"]
    else:
        assert run["epochs_run"] == max_epochs
        assert run["seconds_to_target"] is None and run["epochs_to_target"] is None
    seconds = [p["seconds"] for p in curve]
    assert seconds == sorted(seconds) and seconds[0] > 0
    # The clock leaves validation out: wall minus training seconds is the validation time.
    assert curve[-1]["wall_seconds"] - curve[-1]["seconds"] == pytest.approx(run["eval_seconds"])
    assert run["eval_seconds"] > 0 and run["fit_seconds"] >= curve[-1]["wall_seconds"]
    assert run["examples_per_s"] == pytest.approx(
        run["epochs_run"] * entry["examples_per_epoch"] / curve[-1]["seconds"]
    )
    if len(curve) > 1:  # after the first epoch (which traces the functions)
        assert run["steady_examples_per_s"] == pytest.approx(
            (len(curve) - 1)
            * entry["examples_per_epoch"]
            / (curve[-1]["seconds"] - curve[0]["seconds"])
        )
    else:
        assert run["steady_examples_per_s"] is None
    assert run["final_val_accuracy"] == curve[-1]["val_accuracy"]
    assert run["best_val_accuracy"] == max(p["val_accuracy"] for p in curve)


def test_each_fit_stopped_at_the_target_and_the_figures_follow(bench_run):
    result, tasks = _tasks(bench_run)
    for name, task in tasks:
        target, max_epochs = task["config"]["target_accuracy"], task["config"]["max_epochs"]
        for _n, entry, _rule, run in _runs(task):
            _check_fit(run, entry, target, max_epochs)
        for n, entry in task["per_workers"].items():
            for rule in RULES:
                side = entry["sides"][rule]
                runs = side["runs"]
                assert side["reached"] is all(r["reached"] for r in runs)
                assert len(side["others_cpu"]) == len(runs)
                # Medians over the runs other processes left alone (<= 0.25 cores), else all.
                clean = [r for r, o in zip(runs, side["others_cpu"]) if o is None or o <= 0.25]
                assert side["clean_runs"] == len(clean)
                used = clean or runs
                expected = (
                    statistics.median(r["seconds_to_target"] for r in used)
                    if side["reached"]
                    else None
                )
                assert side["seconds_to_target"] == expected
                assert task["seconds_to_target"][n][rule] == expected
        for rule, label in (("none", "no_scaling"), ("linear", "linear_scaling")):
            one, two = (task["seconds_to_target"][n][rule] for n in ("1", "2"))
            key = f"{name}_{label}_time_ratio"
            assert result[key] == (None if one is None or two is None else pytest.approx(two / one))
            assert result["words"][key].startswith(f"{name}: 2 / 1 workers, time to accuracy")
            # The goal is the compute-bound task's; digits is the counter-example.
            assert result["goals"].get(key) == ("<= 0.6" if name == "patterns" else None)


def test_the_linear_side_trained_at_the_scaled_warmed_up_rate(bench_run):
    result, tasks = _tasks(bench_run)
    config = result["config"]
    base = config["learning_rate"]
    for name, task in tasks:
        for n, entry, rule, run in _runs(task):
            workers = entry["num_workers"]
            # LRScaling("linear", base_global_batch_size=<per-worker batch>): x workers after
            # warmup, ramped linearly from the base rate over warmup_epochs epochs of updates.
            warmup = round(config["warmup_epochs"] * entry["updates_per_epoch"])
            for p in run["curve"]:
                if rule == "none":
                    expected = base
                else:
                    done = min(p["updates"] / warmup, 1.0) if warmup else 1.0
                    expected = base * (1 + (workers - 1) * done)
                assert p["learning_rate"] == pytest.approx(expected, rel=1e-5), (name, n, rule, p)


def test_results_and_png_are_written(bench_run):
    results, output = bench_run
    with open(output) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert_png_written(results, output, "time_to_accuracy")
    assert_machine_is_this_one(results["results"]["time_to_accuracy"]["machine"])


def test_alone_trained_one_worker_in_the_pair_launch_as_the_one_worker_launch(bench_run):
    """Side ``alone`` of the 2-worker launch: worker 0 trained the *none* side's Trainer by itself
    at one worker's batch (the 1-worker launch's updates, rate and accuracies), worker 1 waited
    on almost no CPU, and the same-launch ratios follow from the medians."""
    result, tasks = _tasks(bench_run)
    assert result["config"]["alone"] is True
    for name, task in tasks:
        one, two = task["per_workers"]["1"], task["per_workers"]["2"]
        assert "alone" not in one["sides"] and "alone" not in one
        side, own = two["sides"]["alone"], two["alone"]
        assert (own["global_batch_size"], own["updates_per_epoch"]) == (
            one["global_batch_size"],
            one["updates_per_epoch"],
        )
        assert own["examples_per_epoch"] == one["examples_per_epoch"]
        assert own["untimed_first_fit_seconds"] > 0
        assert side["allreduce_bytes_per_update"] == 0.0
        assert side["val_accuracy_per_worker"]["worker-1"] == []  # it trained nothing
        (run,) = side["runs"]
        _check_fit(run, own, task["config"]["target_accuracy"], task["config"]["max_epochs"])
        (alone_run,) = one["sides"]["none"]["runs"]
        assert [p["updates"] for p in run["curve"]] == [p["updates"] for p in alone_run["curve"]]
        for p, q in zip(run["curve"], alone_run["curve"]):  # the same fit, one launch apart
            assert p["learning_rate"] == pytest.approx(result["config"]["learning_rate"])
            assert p["val_accuracy"] == pytest.approx(q["val_accuracy"], abs=0.05)
        (wait,) = [w["seconds"] for w in own["waits"].values()]
        (cpu,) = [w["cpu_seconds"] for w in own["waits"].values()]
        assert wait[0] >= run["fit_seconds"] * 0.9 and cpu[0] < 0.1 * wait[0] + 0.05
        ratio = lambda a, b: None if a is None or not b else a / b  # noqa: E731
        for rule, label in (("none", "no_scaling"), ("linear", "linear_scaling")):
            figures = two["sides"][rule]
            for figure, field in (("time", "seconds_to_target"),
                                  ("examples_per_s", "steady_examples_per_s")):  # fmt: skip
                key = f"{name}_{label}_{figure}_same_launch_ratio"
                expected = ratio(figures[field], side[field])
                assert result[key] == (None if expected is None else pytest.approx(expected))
                assert "the same launch" in result["words"][key]


def test_bad_time_to_accuracy_options_get_one_clear_error():
    with pytest.raises(ValueError, match=r"Invalid value for argument `target_accuracy`"):
        time_to_accuracy.run(target_accuracy=1.5)
    with pytest.raises(ValueError, match=r"Invalid value for argument `max_epochs`"):
        time_to_accuracy.run(max_epochs=0)
    with pytest.raises(ValueError, match=r"Invalid value for argument `optimizer`"):
        time_to_accuracy.run(optimizer="adamm")
    with pytest.raises(ValueError, match=r"steps_per_execution=0. Expected a positive integer"):
        time_to_accuracy.run(steps_per_execution=0)
    with pytest.raises(ValueError, match=r"Invalid value for argument `option`"):
        time_to_accuracy.run(target=0.9)
    for tasks, received in (
        ("imagenet", "'imagenet'"),
        ((), "''"),
        (["patterns", 3], "'patterns,3'"),
    ):
        with pytest.raises(
            ValueError,
            match=r"^Invalid value for argument `time_to_accuracy_tasks`. "
            rf"Received: time_to_accuracy_tasks={received}. "
            r"Expected one or more of: digits, patterns, comma-separated.",
        ):
            time_to_accuracy.run(tasks=tasks)
    # The flags reach the benchmark under their flag names.
    for flag, value in (("target_accuracy", 0.0), ("time_to_accuracy_tasks", ("mnist",))):
        common.set_options({flag: value})
        try:
            with pytest.raises(ValueError, match=f"`{flag}`"):
                common.registry()["time_to_accuracy"](1, True)
        finally:
            common.set_options(None)
    assert "time_to_accuracy" in runner.ON_REQUEST and "time_to_accuracy" in runner.available()
    with pytest.raises(ValueError, match=r"`uneven_pair`. Received: uneven_pair='yes'"):
        time_to_accuracy.run(uneven_pair="yes")
    with pytest.raises(ValueError, match=r"Invalid value for argument `balance_window`"):
        time_to_accuracy.run(balance_window=0)
    with pytest.raises(ValueError, match=r"`alone`. Received: alone='yes'. Expected True or"):
        time_to_accuracy.run(alone="yes")
    with pytest.raises(ValueError, match=r"alone=True. Expected False unless workers includes 2"):
        time_to_accuracy.run(alone=True, workers=(1,))


def test_the_uneven_pair_trains_the_linear_rule_even_and_balanced():
    """Its sides' Trainer options, and its ratios (the real launch: ``tfdist bench``)."""
    from tfdist.bench.time_to_accuracy import worker

    spec, task = {"balance_window": 8, "warmup_epochs": 1.0}, {"per_worker_batch_size": 64}
    assert worker.rules_of({"uneven": True}) == ("even", "balanced")
    assert worker.rules_of({}) == RULES
    linear = worker.scaling_options("linear", task, spec)["lr_scaling"]
    for side, balance in (("even", False), ("balanced", tfdist.BalanceOptions(window=8))):
        options = worker.scaling_options(side, task, spec)
        assert options["balance"] == balance and options["steps_per_execution"] == 8
        assert vars(options["lr_scaling"]) == vars(linear)
    out = {"words": {}}
    seconds = {"1": {"linear": 20.0}, "2_uneven": {"even": 16.0, "balanced": 12.0}}
    time_to_accuracy.uneven_ratios(out, "patterns", seconds)
    assert out["patterns_uneven_even_time_ratio"] == 0.8
    assert out["patterns_uneven_balanced_time_ratio"] == 0.6
    assert out["patterns_uneven_balanced_speedup"] == pytest.approx(16 / 12)
    seconds["2_uneven"]["balanced"] = None  # not reached
    time_to_accuracy.uneven_ratios(out, "patterns", seconds)
    assert out["patterns_uneven_balanced_time_ratio"] is None
    assert out["patterns_uneven_balanced_speedup"] is None


def test_each_task_has_its_own_settings_unless_an_option_sets_every_tasks():
    from tfdist.bench.time_to_accuracy.tasks import task_specs

    options = dict(time_to_accuracy.DEFAULTS)
    digits, patterns = task_specs(options, quick=False)
    assert (digits["model"], digits["per_worker_batch_size"], digits["target_accuracy"]) == (
        "cnn",
        64,
        0.97,
    )
    assert (patterns["model"], patterns["per_worker_batch_size"], patterns["target_accuracy"]) == (
        "convnet",
        64,
        0.99,
    )
    given = {**options, "per_worker_batch_size": 8, "target_accuracy": 0.9, "max_epochs": 3}
    for task in task_specs(given, quick=True):
        assert (task["per_worker_batch_size"], task["target_accuracy"], task["max_epochs"]) == (
            8,
            0.9,
            3,
        )
    (only,) = task_specs({**options, "tasks": ("patterns",)}, quick=False)
    assert only["name"] == "patterns" and only["train_data"] == {"num_examples": 4096}


def _first_fit(bench_run):
    return bench_run[0]["results"]["first_fit"]


def test_first_fit_every_fit_and_measurement_made_the_updates_asked_on_both_workers(bench_run):
    result = _first_fit(bench_run)
    config = result["config"]
    assert (config["fits"], config["fit_steps"], config["steps"]) == (3, 2, 4)
    assert len(result["launches"]) == config["launches"] == 1
    for launch in result["launches"]:
        assert (launch["num_workers"], launch["global_batch_size"]) == (2, 64)
        assert launch["chief"] == ["worker-0"]
        # The Trainer's fits, then Keras's own model.fit's (the reference), on both workers.
        for fits in (launch["fits_per_worker"], launch["keras_fit"]["fits_per_worker"]):
            assert set(fits) == {"worker-0", "worker-1"}
            for runs in fits.values():
                # Counted optimizer updates, not the steps requested.
                assert [f["updates"] for f in runs] == [config["fit_steps"]] * config["fits"]
                assert all(0 < f["steps_seconds"] <= f["seconds"] for f in runs)
        for side in launch["sides"].values():
            assert side["updates_per_worker"] == {
                t: [config["steps"]] * config["repeats"] for t in ("worker-0", "worker-1")
            }
        # Both workers hold the same model after each side: they trained in lockstep.
        digests = launch["weights_digest"]
        assert digests["worker-0"] == digests["worker-1"]
        assert set(digests["worker-0"]) == {"trainer", "trainer_auto", "raw_loop"}


def test_first_fit_figures_follow_from_the_recorded_seconds(bench_run):
    result = _first_fit(bench_run)
    config = result["config"]
    examples = config["steps"] * config["global_batch_size"]
    (launch,) = result["launches"]
    seconds = [f["seconds"] for f in launch["fits_per_worker"]["worker-0"]]
    assert launch["fit_seconds"] == seconds and launch["first_fit_seconds"] == seconds[0]
    assert launch["later_fits_median_seconds"] == pytest.approx(statistics.median(seconds[1:]))
    # One launch: its first fit; the steady state from its later fits, the quiet ones (other
    # processes <= 0.25 cores) when its first fit was quiet and any later one is.
    others = launch["fit_others_cpu"]
    first_quiet = others[0] is None or others[0] <= 0.25
    calm = [s for s, o in zip(seconds[1:], others[1:]) if o is None or o <= 0.25]
    later = calm if first_quiet and calm else seconds[1:]
    assert result["quiet_launches"] == int(first_quiet)
    assert result["first_fit_seconds"] == seconds[0]
    assert result["steady_fit_seconds"] == pytest.approx(statistics.median(later))
    assert result["first_to_steady_ratio"] == pytest.approx(
        result["first_fit_seconds"] / result["steady_fit_seconds"]
    )
    assert result["second_fit_seconds_per_launch"] == [seconds[1]]
    outside = [f["seconds"] - f["steps_seconds"] for f in launch["fits_per_worker"]["worker-0"]]
    assert launch["fit_outside_steps_seconds"] == pytest.approx(outside)
    assert 0 < result["steady_fit_outside_steps_seconds"] < result["steady_fit_seconds"]
    # Keras's own fits (the reference) are summarised the same way, from their own seconds.
    keras_seconds = [f["seconds"] for f in launch["keras_fit"]["fits_per_worker"]["worker-0"]]
    keras = result["keras_fit"]
    assert launch["keras_fit"]["fit_seconds"] == keras_seconds
    assert keras["first_fit_seconds"] == keras_seconds[0]
    assert keras["first_to_steady_ratio"] == pytest.approx(
        keras["first_fit_seconds"] / keras["steady_fit_seconds"]
    )
    assert keras_seconds[0] not in seconds  # not the Trainer's fits read twice
    # One launch: the Trainer's fits ran first in it (odd launches fit Keras's model first).
    assert launch["keras_first"] is False and keras["order"] == "after the Trainer's fits"
    sides = launch["sides"]
    for side in sides.values():
        assert side["examples_per_s_samples"] == pytest.approx(
            [examples / s for s in side["seconds_samples"]]
        )
        assert len(side["seconds_samples"]) == len(side["others_cpu"]) == config["repeats"]
    rates = result["examples_per_s"]
    for name in ("trainer", "trainer_auto"):
        side = sides[name]
        assert side["call_examples_per_s_samples"] == pytest.approx(
            [
                examples / (s + o)
                for s, o in zip(side["seconds_samples"], side["call_overhead_seconds"])
            ]
        )
        assert result["call_examples_per_s"][name] == pytest.approx(
            side["call_examples_per_s_samples"][0]
        )
    for name in ("trainer", "trainer_auto", "raw_loop"):  # one round: the median is the sample
        assert rates[name] == pytest.approx(sides[name]["examples_per_s_samples"][0])
    round_quiet = all(o is None or o <= 0.25 for side in sides.values() for o in side["others_cpu"])
    assert result["quiet_rounds"] == int(round_quiet)
    assert result["ratio"] == pytest.approx(rates["trainer"] / rates["raw_loop"])
    assert result["trainer_auto_ratio"] == pytest.approx(rates["trainer_auto"] / rates["raw_loop"])
    assert result["within_rounds_ratios"] == pytest.approx(
        {"trainer": result["ratio"], "trainer_auto": result["trainer_auto_ratio"]}
    )
    calls = result["call_examples_per_s"]
    assert result["trainer_call_vs_raw_ratio"] == pytest.approx(
        calls["trainer"] / rates["raw_loop"]
    )
    assert result["trainer_auto_call_vs_raw_ratio"] == pytest.approx(
        calls["trainer_auto"] / rates["raw_loop"]
    )
    assert result["goals"] == {"ratio": ">= 0.95", "first_to_steady_ratio": "<= 1.5"}
    assert_machine_is_this_one(result["machine"])


def test_first_fit_ran_under_the_launchers_default_pinning(bench_run):
    (launch,) = _first_fit(bench_run)["launches"]
    threads = launch["threads"]
    assert set(threads) == {"worker-0", "worker-1"}
    cores = sorted(os.sched_getaffinity(0))
    for task in threads.values():
        # Pinned by tfdist launch (the bench set nothing): intra-op = its CPUs, inter-op >= 2.
        assert task["pinned_by"] == "launcher"
        if len(cores) >= 2:
            assert task["intra_op_threads"] == len(task["cpus"]) == len(cores) // 2
            assert task["inter_op_threads"] == max(2, len(task["cpus"]))
    if len(cores) >= 2:
        cpus = [set(t["cpus"]) for t in threads.values()]
        assert not cpus[0] & cpus[1] and cpus[0] | cpus[1] <= set(cores)


def test_bad_first_fit_options_get_one_clear_error():
    with pytest.raises(ValueError, match=r"Invalid value for argument `fits`. Received: fits=1"):
        first_fit.run(fits=1)
    with pytest.raises(ValueError, match=r"Invalid value for argument `first_fit_launches`"):
        first_fit.run(launches=0)
    with pytest.raises(ValueError, match=r"Invalid value for argument `global_batch_size`"):
        first_fit.run(global_batch_size=63)
    with pytest.raises(ValueError, match=r"Invalid value for argument `option`"):
        first_fit.run(workers=4)
    # The flag reaches the benchmark under its flag name.
    common.set_options({"first_fit_launches": 0})
    try:
        with pytest.raises(ValueError, match="`first_fit_launches`"):
            common.registry()["first_fit"](1, True)
    finally:
        common.set_options(None)
    assert "first_fit" in runner.ON_REQUEST and "first_fit" in runner.available()


def test_the_local_sgd_sides_their_options_bytes_and_ratios():
    """The 2-worker launch's local-SGD sides (their Trainer option, at the base rate), their
    syncs and bytes per update, and their ratios (the real launch: ``tfdist bench``)."""
    from tfdist.bench.harness import fits
    from tfdist.bench.time_to_accuracy import worker

    assert worker.rules_of({"local_sgd": ["diloco_h16"]}) == (*RULES, "diloco_h16")
    option = worker.scaling_options("diloco_h16", {}, {})["local_sgd"]
    assert option.sync_every == 16 and option.outer_optimizer.nesterov
    assert worker.scaling_options("local_sgd_h4", {}, {})["local_sgd"].outer_optimizer is None
    with pytest.raises(ValueError, match=r"`local_sgd`. Received: local_sgd='diloco_16'"):
        time_to_accuracy.run(local_sgd=("diloco_16",))
    with pytest.raises(ValueError, match=r"`workers`. Received: workers=\(3,\)"):
        time_to_accuracy.run(workers=(3,))
    with pytest.raises(ValueError, match=r"`launch_timeout`. Received: launch_timeout=0"):
        time_to_accuracy.run(launch_timeout=0)
    # 40 updates at H=16: syncs at 16 and 32, and the fit's last at 40.
    assert fits.syncs_between(0, 40, 16) == 3 and fits.syncs_between(40, 80, 16) == 3
    assert fits.syncs_between(0, 64, 16) == 4
    assert fits.sync_counts(0, 40, 16) == (2, 1) and fits.sync_counts(0, 64, 16) == (4, 0)
    assert fits.sync_counts(0, 10, 16) == (0, 1)
    runs = [{"points": [{"updates": 20}, {"updates": 40}]}]
    assert time_to_accuracy.bytes_per_update("local_sgd_h16", runs, 1000, 2) == 3 * 1000 / 40
    # Whole rounds only: 2 syncs in 32 updates, the fit's end's sync apart.
    steady = time_to_accuracy.bytes_per_update("local_sgd_h16", runs, 1000, 2, steady=True)
    assert steady == 1000 / 16
    assert time_to_accuracy.local_syncs("diloco_h16_linear", runs) == [[2, 1]]
    assert time_to_accuracy.local_syncs("none", runs) is None
    assert time_to_accuracy.bytes_per_update("diloco_h64", runs, 1000, 2, steady=True) is None
    assert time_to_accuracy.bytes_per_update("none", runs, 1000, 2) == 1000
    assert time_to_accuracy.bytes_per_update("none", runs, 1000, 2, steady=True) == 1000
    assert time_to_accuracy.bytes_per_update("none", runs, 1000, 1) == 0
    side = lambda s, u, b, e=None, sb=None: {  # noqa: E731
        "seconds_to_target": s,
        "updates_to_target": u,
        "allreduce_bytes_per_update": b,
        "steady_allreduce_bytes_per_update": b if sb is None else sb,
        "steady_examples_per_s": e,
    }
    task = {
        "per_workers": {
            "1": {"sides": {"none": side(10.0, 100, 0.0, 4000.0)}},
            "2": {
                "sides": {
                    "none": side(12.0, 60, 1000.0, 5000.0),
                    "linear": side(11.0, 50, 1000.0, 5000.0),
                    "diloco_h16": side(5.0, 80, 75.0, 7000.0, 62.5),
                    "local_sgd_h4_linear": side(6.0, 75, 250.0),
                }
            },
        }
    }
    out = {"words": {}, "goals": {}}
    time_to_accuracy.local_ratios(out, "digits", task)
    assert out["digits_diloco_h16_time_ratio"] == 0.5
    assert out["digits_diloco_h16_updates_ratio"] == pytest.approx(80 / 60)
    assert out["digits_diloco_h16_bytes_ratio"] == 0.0625
    assert out["digits_diloco_h16_fit_bytes_ratio"] == 0.075
    assert out["digits_diloco_h16_examples_per_s_ratio"] == 1.75
    # A _linear side against synchronous training on the linear rule.
    assert out["digits_local_sgd_h4_linear_updates_ratio"] == 1.5
    assert out["digits_local_sgd_h4_linear_examples_per_s_ratio"] is None
    assert out["goals"] == {
        "digits_diloco_h16_time_ratio": "<= 0.6",
        "digits_diloco_h16_examples_per_s_ratio": ">= 1.8",
    }


def test_local_side_names_their_outer_sgd_and_lr_rule():
    """`fits.LOCAL_SIDE`'s names: H, DiLoCo's outer SGD (the paper's by default), ``_linear``,
    ``_adapt`` (after ``_linear``)."""
    from tfdist.bench.harness import fits
    from tfdist.bench.time_to_accuracy import worker

    paper = (0.7, 0.9, True)
    for name, expected in (
        ("local_sgd_h16", (16, None, False, False, 1)),
        ("diloco_h16", (16, paper, False, False, 1)),
        ("diloco_h16_lr0.7_m0.9n", (16, paper, False, False, 1)),
        ("diloco_h4_lr1_m0", (4, (1.0, 0.0, False), False, False, 1)),
        ("diloco_h64_lr1.0_m0.5_linear", (64, (1.0, 0.5, False), True, False, 1)),
        ("local_sgd_h4_linear", (4, None, True, False, 1)),
        ("local_sgd_h16_adapt", (16, None, False, True, 1)),
        ("local_sgd_h16_linear_adapt", (16, None, True, True, 1)),
        ("diloco_h16_adapt", (16, paper, False, True, 1)),
        ("diloco_h16_k4", (16, paper, False, False, 4)),
        ("local_sgd_h16_k4_linear", (16, None, True, False, 4)),
        ("diloco_h16_lr1_m0.5_k2_linear", (16, (1.0, 0.5, False), True, False, 2)),
        ("diloco_h16_k1_adapt", (16, paper, False, True, 1)),
    ):
        assert fits.local_side(name) == expected, name
    for name in (
        "local_sgd_h16_lr1_m0",
        "diloco_h16_m0.5",
        "diloco_h16_lr1_m1",
        "diloco_h0",
        16,
        "local_sgd_h16_adapt_linear",
        "diloco_h16_adapt_adapt",
        "diloco_h16_linear_k4",
        "diloco_h16_k0",
        "diloco_h16_k4_lr1_m0",
    ):
        assert fits.local_side(name) is None, name
        with pytest.raises(ValueError, match=r"Invalid value for argument `local_sgd`"):
            fits.check_local_sides([name], linear=True, adapt=True)
    # Only a benchmark that applies the LR rule takes _linear.
    assert fits.check_local_sides(["diloco_h16_linear"], linear=True) == ("diloco_h16_linear",)
    with pytest.raises(ValueError, match=r"local_sgd='diloco_h16_linear'"):
        fits.check_local_sides(["diloco_h16_linear"])
    outer = fits.local_sgd_option("diloco_h16_lr0.5_m0.9n").outer_optimizer
    assert (float(outer.learning_rate), outer.momentum, outer.nesterov) == (0.5, 0.9, True)
    outer = fits.local_sgd_option("diloco_h4_lr1_m0.5_linear").outer_optimizer
    assert (float(outer.learning_rate), outer.momentum, outer.nesterov) == (1.0, 0.5, False)
    spec, task = {"warmup_epochs": 1.0}, {"per_worker_batch_size": 64}
    options = worker.scaling_options("diloco_h4_lr1_m0.5_linear", task, spec)
    linear = worker.scaling_options("linear", task, spec)["lr_scaling"]
    assert vars(options["lr_scaling"]) == vars(linear)
    assert options["local_sgd"].sync_every == 4
    assert "lr_scaling" not in worker.scaling_options("diloco_h4_lr1_m0.5", task, spec)


def test_fragment_sides_are_refused_where_the_option_refuses_them_and_count_their_bytes():
    """``_k<K>`` (streaming DiLoCo): K must divide H and stands not beside ``_adapt`` (refused
    naming ``local_sgd`` before anything launches); a sync carries one fragment's bytes, so a
    fit's bytes are those of its fragments' syncs (its end syncs every fragment but the one due
    at its last update) and whole rounds still send the model once per H updates."""
    from tfdist.bench.harness import fits

    for name, expected in (
        ("diloco_h16_k3", "_k<K> a divisor of H (K=3, H=16)"),
        ("local_sgd_h4_k8", "_k<K> a divisor of H (K=8, H=4)"),
        ("local_sgd_h16_k4_linear_adapt", "_k<K> with K = 1 beside _adapt"),
    ):
        with pytest.raises(ValueError, match=rf"`local_sgd`. Received: local_sgd='{name}'"):
            fits.check_local_sides([name], linear=True, adapt=True)
        with pytest.raises(ValueError) as refused:
            time_to_accuracy.run(workers=(2,), local_sgd=(name,))  # before any launch
        assert expected in str(refused.value)
    option = fits.local_sgd_option("diloco_h16_k4")
    assert (option.sync_every, option.fragments) == (16, 4) and option.outer_optimizer.nesterov
    assert fits.local_sgd_option("local_sgd_h16_k4_linear").fragments == 4
    # H=16, K=4: a fragment every 4 updates (offsets 4, 8, 12, 0); 40 updates: 10 scheduled
    # syncs, then the fit's end (fragments 0, 2 and 3: fragment 1 synced at update 40).
    assert fits.sync_counts(0, 40, 16, 4) == (10, 1) and fits.sync_counts(0, 64, 16, 4) == (16, 1)
    assert fits.syncs_between(40, 80, 16, 4) == 11
    pieces = [100, 10, 1, 1000]
    assert fits.sync_bytes(0, 40, 16, pieces) == (2 * 1111 + 100 + 10, 100 + 1 + 1000)
    assert fits.sync_bytes(0, 64, 16, pieces) == (4 * 1111, 111)
    assert fits.sync_bytes(0, 40, 16, [1111]) == (2 * 1111, 1111)  # K = 1: sync_counts' syncs
    assert fits.bytes_per_sync(pieces) == 1000 / 1111 and fits.bytes_per_sync([7]) == 1.0
    figures = fits.local_bytes("diloco_h16_k4", [40, 64], 1111, 2, pieces)
    assert figures["allreduce_bytes_per_update"] == pytest.approx(
        ((2 * 1111 + 110 + 1101) / 40 + (4 * 1111 + 111) / 64) / 2
    )
    assert figures["steady_allreduce_bytes_per_update"] == 1111 / 16  # 1/H of synchronous
    assert figures["local_syncs"] == [[10, 1], [16, 1]]
    assert figures["bytes_per_sync"] == 1000 / 1111
    even = fits.local_bytes("diloco_h16_k4", [40], 1000, 2)  # no record: the model cut evenly
    assert even["bytes_per_sync"] == 0.25 and even["steady_allreduce_bytes_per_update"] == 62.5
    assert fits.local_bytes("diloco_h16_k4", [40], 1000, 1)["allreduce_bytes_per_update"] == 0
    runs = [{"points": [{"updates": 40}]}]
    assert time_to_accuracy.local_syncs("diloco_h16_k4", runs) == [[10, 1]]
    # No record of the cut: 10 quarters, then 3 at the end.
    assert time_to_accuracy.bytes_per_update("diloco_h16_k4", runs, 1000, 2) == 13 * 250 / 40


def test_an_adapt_side_adapts_with_the_straggler_report_off_and_other_benches_refuse_it():
    """``_adapt``: ``LocalSGDOptions(adapt_to_stragglers=True)`` and ``stragglers=None`` (the
    Trainer refuses both on several workers); on the uneven pair every local side runs without
    the report, so plain and adapting differ in adapting alone. ``scaling`` and
    ``language_model`` refuse the suffix, naming ``local_sgd``, before launching anything."""
    from tfdist.bench.harness import fits
    from tfdist.bench.language_model import parent as language_model
    from tfdist.bench.scaling import parent as scaling
    from tfdist.bench.time_to_accuracy import worker

    assert fits.local_sgd_option("diloco_h16_adapt").adapt_to_stragglers
    assert not fits.local_sgd_option("diloco_h16").adapt_to_stragglers
    spec, task = {"warmup_epochs": 1.0}, {"per_worker_batch_size": 64}
    options = worker.scaling_options("local_sgd_h16_linear_adapt", task, spec)
    assert options["stragglers"] is None and options["local_sgd"].adapt_to_stragglers
    assert options["local_sgd"].sync_every == 16 and "lr_scaling" in options
    assert "stragglers" not in worker.scaling_options("local_sgd_h16_linear", task, spec)
    uneven = {**spec, "uneven": True, "uneven_local_sgd": ["local_sgd_h16_linear"]}
    assert worker.scaling_options("local_sgd_h16_linear", task, uneven)["stragglers"] is None
    assert "stragglers" not in worker.scaling_options("even", task, {**uneven, "balance_window": 8})
    assert worker.rules_of(uneven) == ("even", "balanced", "local_sgd_h16_linear")
    assert fits.check_local_sides(["diloco_h16_adapt"], adapt=True) == ("diloco_h16_adapt",)
    for run, name in (
        (scaling.run, "local_sgd"),
        (language_model.run, "local_sgd"),
        (language_model.run, "local_sgd_to_target"),
    ):
        with pytest.raises(ValueError, match=r"`local_sgd`. Received: local_sgd='diloco_h2_adapt'"):
            run(**{name: ("diloco_h2_adapt",)})
    with pytest.raises(ValueError, match=r"`uneven_local_sgd`. Received: uneven_local_sgd="):
        time_to_accuracy.run(uneven_local_sgd=("local_sgd_h16",), uneven_pair=False)
    with pytest.raises(ValueError, match=r"`uneven_local_sgd`. Received: uneven_local_sgd='h16'"):
        time_to_accuracy.run(uneven_local_sgd=("h16",))


def test_an_adapt_side_records_its_inner_steps_in_process():
    """One fit of ``local_sgd_h2_linear_adapt`` on the quick patterns task, one_device in this
    process (`worker.fit_to_target`, as a launched task runs it): the Trainer takes the side's
    options, the data's length is known, and each epoch's point carries ``local_steps`` (one
    worker: every update taken)."""
    from tfdist.bench.harness import fits
    from tfdist.bench.harness.worker_common import Recorder
    from tfdist.bench.time_to_accuracy import worker
    from tfdist.bench.time_to_accuracy.tasks import task_specs

    (task,) = task_specs({**time_to_accuracy.DEFAULTS, "tasks": ("patterns",)}, quick=True)
    spec = {**time_to_accuracy.DEFAULTS, "learning_rate": 2e-3, "warmup_epochs": 1.0}
    rule = "local_sgd_h2_linear_adapt"
    strategy = tfdist.make_strategy("one_device")
    gbs = task["per_worker_batch_size"]
    train = tfdist.data.load(task["dataset"], split="train", seed=0, **task["train_data"])
    val = tfdist.data.load(task["dataset"], split="validation", seed=0, **task["validation_data"])
    builder = fits.seeded(
        lambda: tfdist.models.get(
            task["model"], input_shape=train.input_shape, num_classes=train.num_classes,
            **task["model_options"],
        )
    )  # fmt: skip
    trainer = worker.side_trainer(strategy, builder, task, spec, rule)
    run = worker.fit_to_target(trainer, (train, val, gbs), task, rule, Recorder())
    assert run["points"] and all(p["local_steps"] == p["updates"] > 0 for p in run["points"])


def _adapt_launches():
    """Made-up records of a 1-worker launch and the uneven pair with a plain and an adapting
    local side (2 workers, 128 examples a global batch, 32 updates an epoch)."""

    def points(seconds, accuracy, steps=None):
        out = []
        for i, (s, a) in enumerate(zip(seconds, accuracy)):
            p = {"epoch": i + 1, "seconds": s, "wall_seconds": s + 1, "val_accuracy": a}
            p.update({"updates": 32 * (i + 1), "learning_rate": 4e-3})
            out.append(p if steps is None else {**p, "local_steps": steps[i]})
        return out

    def run(curve):
        return {"points": curve, "eval_seconds": 1.0, "fit_seconds": 99.0, "is_chief": True}

    def process(sides, workers, steps=None):
        return {
            "strategy": "multi_worker" if workers > 1 else "one_device",
            "num_workers": workers,
            "is_chief": True,
            "threads": {"intra_op_threads": 1},
            "records": {},
            "tasks": {
                "patterns": {
                    "global_batch_size": 64 * workers,
                    "updates_per_epoch": 64 // workers,
                    "examples_per_epoch": 4096,
                    "train_examples": 4096,
                    "validation_examples": 1024,
                    "untimed_first_fit_seconds": 9.0,
                    "parameters": 1000,
                    "runs": {rule: [run(curve)] for rule, curve in sides.items()},
                }
            },
        }

    acc3, acc4 = [0.5, 0.9, 0.995], [0.5, 0.9, 0.98, 0.991]
    sides = {
        "even": points([30, 60, 90], acc3),
        "balanced": points([25, 50, 75], acc3),
        "local_sgd_h16_linear": points([20, 40, 60], acc3),
    }
    adapt = {0: [32, 64, 96, 128], 1: [32, 48, 64, 80]}  # worker 1 skips half from epoch 2
    uneven = {
        f"worker-{w}": process(
            {**sides, "local_sgd_h16_linear_adapt": points([20, 32, 44, 56], acc4, adapt[w])}, 2
        )
        for w in (0, 1)
    }
    one = points([100 / 3, 200 / 3, 100], acc3)
    launch = lambda tasks: {"tasks": tasks, "others_cpu": None, "launch_seconds": 9.0}  # noqa: E731
    return {
        "1": launch({"worker-0": process({"none": one, "linear": one}, 1)}),
        "2_uneven": launch(uneven),
    }


def test_the_uneven_pairs_local_sides_count_only_examples_trained_on():
    """Pure, on made-up records: an adapting side's examples count each worker's inner steps
    (a skipped update's batch read and dropped), its steps per worker are reported, and its
    seconds, updates and steady examples/s over the plain side's; a side that skips nothing
    keeps its figures (updates x global batch)."""
    from tfdist.bench.time_to_accuracy.tasks import task_specs

    (task,) = task_specs({**time_to_accuracy.DEFAULTS, "tasks": ("patterns",)}, quick=False)
    spec = {"tasks": [task], "warmup_epochs": 1.0, "uneven_local_sgd": ["a", "b"]}
    out = time_to_accuracy.summarise(spec, _adapt_launches())
    sides = out["tasks"]["patterns"]["per_workers"]["2_uneven"]["sides"]
    plain, adapt = sides["local_sgd_h16_linear"], sides["local_sgd_h16_linear_adapt"]
    assert plain["steps_per_worker"] == {"worker-0": [96], "worker-1": [96]}
    assert adapt["steps_per_worker"] == {"worker-0": [128], "worker-1": [80]}
    assert sides["even"]["steps_per_worker"] is None
    # 64 examples a worker's step: (128 + 80) * 64 trained by the target, 4096 in epoch 1.
    assert adapt["examples_to_target"] == 208 * 64 and plain["examples_to_target"] == 3 * 4096
    assert adapt["steady_examples_per_s"] == pytest.approx((208 * 64 - 4096) / 36)
    assert plain["steady_examples_per_s"] == pytest.approx(2 * 4096 / 40)
    assert sides["even"]["steady_examples_per_s"] == pytest.approx(2 * 4096 / 60)
    curve = adapt["runs"][0]["curve"]
    assert [p["local_steps"]["worker-1"] for p in curve] == [32, 48, 64, 80]
    assert [p["trained_examples"] for p in curve] == [64 * (a + b) for a, b in zip(
        [32, 64, 96, 128], [32, 48, 64, 80])]  # fmt: skip
    key = "patterns_uneven_local_sgd_h16_linear_adapt"
    assert out[f"{key}_over_plain_seconds"] == pytest.approx(56 / 60)
    assert out[f"{key}_over_plain_updates"] == pytest.approx(128 / 96)
    assert out[f"{key}_over_plain_examples_per_s"] == pytest.approx((208 * 64 - 4096) / 36 / 204.8)
    assert out[f"{key}_time_ratio"] == pytest.approx(0.56)
    assert out["patterns_uneven_local_sgd_h16_linear_time_ratio"] == pytest.approx(0.6)
    assert "local_sgd_h16_linear_over_plain_seconds" not in str(out.keys())
    assert out["patterns_uneven_balanced_speedup"] == pytest.approx(90 / 75)
    assert out["words"][f"{key}_over_plain_examples_per_s"].endswith("examples/s trained on")
    # Without the 1-worker launch: no time ratios over it, the rest alike.
    del out
    launches = _adapt_launches()
    del launches["1"]
    out = time_to_accuracy.summarise(spec, launches)
    assert out[f"{key}_time_ratio"] is None and out["patterns_uneven_even_time_ratio"] is None
    assert out[f"{key}_over_plain_seconds"] == pytest.approx(56 / 60)


def _alone_launch(alone=True):
    """Made-up records of a 2-worker launch of digits (128 a global batch, 11 updates an epoch)
    with 2 repeats of none, linear, diloco_h16 and, with ``alone``, worker 0 by itself (64 a
    batch, 22 updates an epoch) while worker 1 waited."""

    def run(seconds, per_epoch):
        accuracy = (0.5, 0.9, 0.98)
        points = [
            {"epoch": i + 1, "seconds": s, "wall_seconds": s + 1, "val_accuracy": a,
             "updates": per_epoch * (i + 1), "learning_rate": 2e-3}
            for i, (s, a) in enumerate(zip(seconds, accuracy))
        ]  # fmt: skip
        return {"points": points, "eval_seconds": 1.0, "fit_seconds": 99.0, "is_chief": True}

    sides = {
        "none": [run([2, 4, 6], 11)] * 2,
        "linear": [run([2, 3, 4], 11)] * 2,
        "diloco_h16": [run([1, 2, 3], 11), run([1, 3, 5], 11)],
    }
    by_itself = {"alone": [run([3, 6, 9], 22), run([2, 4, 6], 22)]} if alone else {}
    wait = {"seconds": 9.5, "cpu_seconds": 0.01, "busy_cpu_seconds": None}

    def process(worker):
        task = {
            "global_batch_size": 128, "updates_per_epoch": 11, "examples_per_epoch": 1408,
            "train_examples": 1437, "validation_examples": 360,
            "untimed_first_fit_seconds": 2.0, "parameters": 1000,
            "runs": {**sides, **({"alone": by_itself["alone"] if worker == 0 else []}
                                 if alone else {})},
        }  # fmt: skip
        if alone:
            task["alone"] = (
                {"global_batch_size": 64, "updates_per_epoch": 22, "examples_per_epoch": 1408,
                 "untimed_first_fit_seconds": 1.5}
                if worker == 0 else {"untimed_first_fit_seconds": None}
            )  # fmt: skip
        records = {"digits/alone": [wait, wait]} if alone and worker == 1 else {}
        return {"strategy": "multi_worker", "num_workers": 2, "is_chief": worker == 0,
                "threads": {}, "records": records, "tasks": {"digits": task}}  # fmt: skip

    tasks = {f"worker-{w}": process(w) for w in (0, 1)}
    return {"2": {"tasks": tasks, "others_cpu": None, "launch_seconds": 60.0}}


def test_the_same_launch_ratios_over_alone_follow_from_the_medians():
    """Pure, on made-up records: side ``alone`` counts its own epoch (one worker's batch), its
    bytes are none, worker 1's waits are reported, and each 2-worker side's steady examples/s
    and seconds over alone's are the ratios of the medians (per repeat beside them); issue 43's
    goals on diloco_h16's. Without alone, no same-launch figure."""
    from tfdist.bench.time_to_accuracy import worker
    from tfdist.bench.time_to_accuracy.tasks import task_specs

    assert worker.rules_of({"alone": True, "local_sgd": ["diloco_h16"]}) == (
        *RULES, "diloco_h16", "alone")  # fmt: skip
    assert worker.rules_of({"alone": True, "uneven": True}) == ("even", "balanced")
    (task,) = task_specs({**time_to_accuracy.DEFAULTS, "tasks": ("digits",)}, quick=False)
    spec = {"tasks": [task], "warmup_epochs": 1.0}
    out = time_to_accuracy.summarise(spec, _alone_launch())
    entry = out["tasks"]["digits"]["per_workers"]["2"]
    alone = entry["sides"]["alone"]
    assert entry["alone"]["waits"] == {
        "worker-1": {"seconds": [9.5, 9.5], "cpu_seconds": [0.01, 0.01]}
    }
    assert alone["allreduce_bytes_per_update"] == 0.0 and alone["local_syncs"] is None
    assert alone["updates_to_target"] == 66 and alone["examples_to_target"] == 3 * 1408
    # Steady: 2 epochs of 1408 examples in 6 s and in 4 s; medians 7.5 s and 586.7 examples/s.
    assert alone["seconds_to_target"] == 7.5
    assert alone["steady_examples_per_s"] == pytest.approx((2816 / 6 + 2816 / 4) / 2)
    steady = lambda seconds: 2816 / seconds  # noqa: E731
    for label, seconds, rate in (
        ("no_scaling", 6, steady(4)),
        ("linear_scaling", 4, steady(2)),
        ("diloco_h16", 4, (steady(2) + steady(4)) / 2),  # medians of 2: 3 and 5 s; 2 and 4 s
    ):
        time_key = f"digits_{label}_time_same_launch_ratio"
        rate_key = f"digits_{label}_examples_per_s_same_launch_ratio"
        assert out[time_key] == pytest.approx(seconds / 7.5)
        assert out[rate_key] == pytest.approx(rate / alone["steady_examples_per_s"])
        assert "worker 0 alone on one_device in the same launch" in out["words"][rate_key]
    per_repeat = out["tasks"]["digits"]["same_launch_per_repeat"]
    assert per_repeat["diloco_h16"]["time"] == pytest.approx([3 / 9, 5 / 6])
    assert per_repeat["no_scaling"]["examples_per_s"] == pytest.approx(
        [steady(4) / steady(6), 1.0])  # fmt: skip
    assert set(per_repeat) == {"no_scaling", "linear_scaling", "diloco_h16"}
    assert out["goals"]["digits_diloco_h16_examples_per_s_same_launch_ratio"] == ">= 1.8"
    assert out["goals"]["digits_diloco_h16_time_same_launch_ratio"] == "<= 0.6"
    # The figures over the 1-worker launch stay (None: it did not run).
    assert out["digits_diloco_h16_examples_per_s_ratio"] is None
    out = time_to_accuracy.summarise(spec, _alone_launch(alone=False))
    assert not [k for k in out if "same_launch" in k]
    assert "alone" not in out["tasks"]["digits"]["per_workers"]["2"]
