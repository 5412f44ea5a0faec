"""``tfdist bench --benchmarks=memory``, in-process and cheap: no worker process is launched.

The worker's measurement runs on the mirrored strategy (2 virtual devices) at a tiny size;
the launch summaries, ratios, goals, table rows and chart are built from made-up worker
results, so each figure can be checked against the numbers it comes from. Nothing here
asserts speed or a memory saving: the bench measures those.
"""

import math

import pytest

import tfdist
from tests.bench.checks import assert_machine_is_this_one
from tfdist.bench import runner
from tfdist.bench.harness import common, plots, report
from tfdist.bench.memory import cap as memory_cap
from tfdist.bench.memory import parent as memory
from tfdist.bench.memory import worker as memory_worker

MIB = 1 << 20
TINY = {
    # The allocator counts tensors of 256 KiB and more: a 256x1024 kernel (1 MiB) and its blocks.
    "input_dim": 256,
    "hidden_units": [1024],
    "num_classes": 10,
    "per_worker_batch_size": 8,
    "warmup_steps": 1,
    "steps": 2,
    "repeats": 1,
    "learning_rate": 1e-3,
    "seed": 0,
}


def test_the_worker_measures_each_mode_and_saves_its_weights(tmp_path):
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    results = {}
    for mode in ("unsharded", "optimizer"):
        spec = {**TINY, "sharding": memory.MODES[mode], "weights_path": str(tmp_path / f"2-{mode}")}
        results[mode] = memory_worker.measure(spec, strategy)
    params = 256 * 1024 + 1024 + 1024 * 10 + 10
    for mode, result in results.items():
        assert result["sharding"] == memory.MODES[mode] and result["num_replicas"] == 2
        assert result["parameters"] == params and result["global_batch_size"] == 16
        assert result["updates"] == [TINY["steps"]] and len(result["seconds"]) == 1
        assert result["seconds"][0] > 0 and len(result["records"]["steps"]) == 1
        readings = result["memory"]
        assert set(readings) == {"before", "after_warmup", "after_steps"}
        # TF counts its CPU allocations only with oneDNN's allocator (on by default with
        # AVX-512 or AMX): elsewhere (an AVX2-only CPU) the worker reports None, as documented.
        counted = readings["before"]["allocator_current"] is not None
        if counted:  # the 1 MiB kernel, its Adam moments (or their blocks) and gradient
            assert readings["after_steps"]["allocator_current"] >= MIB
        for reading in readings.values():
            if counted:
                assert reading["allocator_peak"] >= reading["allocator_current"] >= 0
            else:
                assert reading["allocator_peak"] is reading["allocator_current"] is None
            assert reading["rss_peak"] >= reading["rss"] > 0
    plain, sharded = (results[m] for m in ("unsharded", "optimizer"))
    # Adam's two moments per variable: whole, or this replica's blocks (half, plus padding).
    assert plain["optimizer_variables"]["slots"] == 2 * params * 4
    assert sharded["optimizer_variables"]["slots"] == 2 * sharded["replica_bytes"]["master_shards"]
    assert plain["replica_bytes"]["optimizer_state"] == 2 * params * 4 + 12  # iterations, lr
    assert sharded["replica_bytes"]["unsharded"] == plain["replica_bytes"]["unsharded"]
    # Sharding changes where the state lives, not the training: the same final weights.
    assert memory.weight_gaps(str(tmp_path), 2) == {"optimizer": pytest.approx(0.0, abs=1e-7)}


def test_the_gpt_workload_reads_token_windows_and_predicts_the_next_tokens():
    # The worker's measurement is the MLP's above; the GPT's training under sharded parameters
    # is tested against unsharded in tests/training/zero. Here: its model and data, untrained.
    gpt = {**memory.QUICK["gpt"], "per_worker_batch_size": 2}
    spec = memory.workload_spec({**TINY, "workload": "gpt", "gpt": gpt}, "gpt")
    assert spec["per_worker_batch_size"] == 2
    x, y = next(iter(memory_worker.dataset(spec, 4)))
    # Token windows of seq_len and their next tokens, in the vocabulary.
    assert x.shape == y.shape == (4, gpt["seq_len"]) and x.dtype == y.dtype == "int32"
    assert (x.numpy()[:, 1:] == y.numpy()[:, :-1]).all() and y.numpy().max() < 512
    model = memory_worker.build(spec)
    assert model.output_shape == (None, gpt["seq_len"], gpt["vocabulary_size"])
    width, vocab = gpt["width"], gpt["vocabulary_size"]
    # Per block: attention 4 (w*w + w), MLP 8 w*w + 5 w, two LayerNorms 4 w; embeddings, logits.
    block = 4 * (width * width + width) + 8 * width * width + 5 * width + 4 * width
    embeddings = vocab * width + gpt["seq_len"] * width
    assert model.count_params() == block + embeddings + 2 * width + width * vocab + vocab


def _task(mode, worker, *, peak, steps_peak, current, rss_peak, seconds, n=2):
    """A worker's result as ``memory_worker.measure`` returns it, with made-up figures."""
    whole, blocks = 4000, 2000 if n == 2 else 4000  # trainable bytes; this replica's blocks
    sharded = mode != "unsharded"
    slots = 2 * (blocks if sharded else whole)

    def reading(peak_bytes, current_bytes):
        return {
            "allocator_current": current_bytes,
            "allocator_peak": peak_bytes,
            "rss": rss_peak - 1,
            "rss_peak": rss_peak,
        }

    return {
        "steps": 4,
        "global_batch_size": 8 * n,
        "seconds": list(seconds),
        "updates": [4] * len(seconds),
        "parameters": 1000,
        "replica_bytes": {
            "parameters": blocks if mode == "parameters" else whole,
            "optimizer_state": slots + 12,
            "gradients": blocks if mode in ("gradients", "parameters") else whole,
            "master_shards": blocks if mode in ("optimizer", "gradients") else 0,
        },
        "optimizer_variables": {"slots": slots, "scalars": 12},
        "memory": {
            "before": reading(0, 0),
            "after_warmup": reading(peak, current),
            "after_steps": reading(steps_peak, current),
        },
        "weights_digest": "same" if worker == 0 or mode != "gradients" else "other",
        "records": {
            "steps": [{"seconds": s, "cpu_seconds": s, "busy_cpu_seconds": None} for s in seconds]
        },
        "threads": {"intra_op_threads": 1},
    }


# Worker 1 is the one with the most memory; each mode's peak and examples/s made up.
FIGURES = {
    "unsharded": dict(peak=20000, steps_peak=18000, current=12000, rss_peak=80000, seconds=[1, 2]),
    "optimizer": dict(peak=16000, steps_peak=14000, current=10000, rss_peak=60000, seconds=[1, 1]),
    "gradients": dict(peak=14000, steps_peak=14000, current=9000, rss_peak=72000, seconds=[2, 2]),
    "parameters": dict(peak=8000, steps_peak=8000, current=7000, rss_peak=50000, seconds=[2, 4]),
}
#: The modes of each made-up workload.
MODES = {
    "mlp": ("unsharded", "optimizer", "gradients"),
    "gpt": ("unsharded", "gradients", "parameters"),
}


def _launched(mode, n):
    tasks = {}
    for i in range(n):
        figures = dict(FIGURES[mode])
        if i == 1:  # the worker with the most
            figures.update(peak=figures["peak"] + 2000, current=figures["current"] + 200)
        tasks[f"worker-{i}"] = _task(mode, i, n=n, **figures)
    return {"tasks": tasks, "launch_seconds": 30.0, "others_cpu": 0.1}


def _per_workers(workload):
    return {
        str(n): {mode: memory.summarise_launch(_launched(mode, n)) for mode in MODES[workload]}
        for n in (1, 2)
    }


@pytest.fixture(scope="module")
def summary():
    spec = {**memory.DEFAULTS, "threads_per_worker": 1, "workers": [1, 2]}
    gaps = {"1": {"optimizer": 0.0, "gradients": 0.0}, "2": {"optimizer": 0.0, "gradients": 3e-8}}
    gpt_gaps = {"1": {"gradients": 0.0, "parameters": 0.0}, "2": {"parameters": 1e-7}}
    runs = {"mlp": (_per_workers("mlp"), gaps), "gpt": (_per_workers("gpt"), gpt_gaps)}
    return memory.summarise(spec, runs)


def test_launch_summaries_take_the_worker_with_the_most_and_the_median_rate(summary):
    mlp = summary["workloads"]["mlp"]
    entry = mlp["per_workers"]["2"]["unsharded"]
    # Examples/s over the timed fits (4 steps of 16 examples in 1 s and 2 s), the median.
    assert entry["examples_per_s_samples"] == [64.0, 32.0] and entry["examples_per_s"] == 48.0
    assert entry["step_s"] == pytest.approx(1.5 / 4)
    # The whole run's peak (warm-up and build included) and the rest on the worker with the most.
    assert entry["worst_worker"] == {
        "allocator_peak": 22000,
        # What stays from step to step: the parameters and Adam's slots and scalars.
        "allocator_peak_above_kept": 22000 - (4000 + 8012),
        "allocator_steps_peak": 18000,
        "allocator_current": 12200,
        "rss_peak": 80000,
        "rss": 79999,
    }
    assert entry["updates_per_worker"] == {"worker-0": [4, 4], "worker-1": [4, 4]}
    assert mlp["workers_agree"]["2"] == {"unsharded": True, "optimizer": True, "gradients": False}
    assert mlp["weights_identical"]["2"] == {"optimizer": True, "gradients": False}
    assert mlp["max_weight_gap"]["2"]["gradients"] == 3e-8
    assert summary["workloads"]["gpt"]["max_weight_gap"]["2"] == {"parameters": 1e-7}
    assert summary["config"]["workloads"] == ["mlp", "gpt"]
    assert_machine_is_this_one(summary["machine"])


def test_ratios_against_unsharded_and_their_goals_at_the_most_workers(summary):
    mlp = summary["workloads"]["mlp"]
    two = mlp["versus_unsharded"]["2"]["optimizer"]
    assert two["allocator_peak"] == pytest.approx(18000 / 22000)
    assert two["allocator_steps_peak"] == pytest.approx(14000 / 18000)
    assert two["allocator_current"] == pytest.approx(10200 / 12200)
    assert two["rss_peak"] == pytest.approx(60000 / 80000)
    assert two["examples_per_s"] == pytest.approx(64.0 / 48.0)
    assert two["optimizer_state"] == pytest.approx(4012 / 8012)
    kept = mlp["per_workers"]["2"]["optimizer"]["kept_bytes"]
    assert kept == 4000 + 4012 + 2000  # the master shards too
    assert two["allocator_peak_above_kept"] == pytest.approx((18000 - kept) / (22000 - 12012))
    assert summary["mlp_optimizer_2w_allocator_peak_ratio"] == two["allocator_peak"]
    # Goals at 2 workers only; the state's bound: Adam's slots cut to the blocks, scalars whole.
    bound = math.ceil((8000 * 2000 / 4000 + 12) / 8012 * 1e6) / 1e6
    # Each workload's own: "parameters" at most 0.45 on the GPT (0.55 on the MLP).
    peaks = {"optimizer": "<= 0.75", "gradients": "<= 0.70", "parameters": "<= 0.45"}
    assert summary["goals"] == {
        f"{workload}_{mode}_2w_{figure}_ratio": goal
        for workload, modes in MODES.items()
        for mode in modes[1:]
        for figure, goal in (
            ("optimizer_state", f"<= {bound}"),
            ("allocator_peak", peaks[mode]),
            ("examples_per_s", ">= 0.95"),
        )
    }
    assert memory.PEAK_GOALS["mlp"]["parameters"] == "<= 0.55"
    assert summary["gpt_parameters_2w_allocator_peak_ratio"] == pytest.approx(10000 / 22000)
    # At 1 worker: the peak and examples/s only, without goals.
    one = {k for k in summary if k.endswith("_ratio") and "_1w_" in k}
    assert one == {
        f"{w}_{m}_1w_{f}_ratio"
        for w, modes in MODES.items()
        for m in modes[1:]
        for f in ("allocator_peak", "examples_per_s")
    }


def test_the_state_bound_of_sharded_parameters_takes_the_parameters_blocks():
    # Under "parameters" the blocks are the parameters themselves: no master shards, and the
    # one gradient buffer (this benchmark does not accumulate) is the blocks' size.
    base = {
        "replica_bytes": {"gradients": 4000},
        "optimizer_variables": {"worker-0": {"slots": 8000, "scalars": 12}},
    }
    sharded = {"replica_bytes": {"master_shards": 0, "gradients": 2000}}
    assert memory.MODES["parameters"] == "parameters"
    assert memory.state_bound(base, sharded) == math.ceil((4000 + 12) / 8012 * 1e6) / 1e6


def test_examples_per_s_ratio_counts_quiet_fits_only_when_both_launches_had_some(summary):
    entries = summary["workloads"]["mlp"]["per_workers"]["2"]
    base, entry = (dict(entries[m]) for m in ("unsharded", "optimizer"))
    base.update(examples_per_s=40.0, quiet_examples_per_s=50.0)
    entry.update(examples_per_s=30.0, quiet_examples_per_s=45.0)
    figures = memory.versus(base, entry)
    assert figures["examples_per_s"] == pytest.approx(0.9) and figures["examples_per_s_quiet"]
    entry["quiet_examples_per_s"] = None  # every fit of this launch was disturbed: all of both
    figures = memory.versus(base, entry)
    assert figures["examples_per_s"] == pytest.approx(0.75)
    assert figures["examples_per_s_quiet"] is False


def test_the_summary_table_words_each_ratio_and_says_whether_its_goal_is_met(summary):
    rows = {f["key"]: f for f in report.figures({"results": {"memory": summary}})}
    # Two sharded modes per workload; 6 figures at 2 workers, 2 at 1: nothing nested counted.
    assert len(rows) == 4 * (len(memory.FIGURES) + 2)
    peak = rows["mlp_optimizer_2w_allocator_peak_ratio"]
    assert (
        peak["words"]
        == "mlp: optimizer / unsharded, 2 worker(s): TF allocator peak per worker (whole run)"
    )
    assert (peak["goal"], peak["met"]) == ("<= 0.75", False)  # 18000 / 22000 = 0.82
    gradients = rows["mlp_gradients_2w_allocator_peak_ratio"]
    assert (gradients["goal"], gradients["met"]) == ("<= 0.70", False)  # 16000 / 22000 = 0.73
    parameters = rows["gpt_parameters_2w_allocator_peak_ratio"]
    assert (parameters["goal"], parameters["met"]) == ("<= 0.45", False)  # 10000 / 22000
    assert rows["mlp_optimizer_2w_examples_per_s_ratio"]["met"] is True
    assert rows["mlp_gradients_2w_examples_per_s_ratio"]["met"] is False  # 32 / 48
    assert rows["mlp_optimizer_2w_optimizer_state_ratio"]["met"] is True
    assert rows["mlp_optimizer_1w_allocator_peak_ratio"]["goal"] is None
    table = report.summary({"meta": {}, "results": {"memory": summary}})
    assert "mlp: gradients / unsharded, 2 worker(s): examples/s" in table and "NO" in table


def test_the_memory_chart_is_a_png(summary, tmp_path):
    path = str(tmp_path / "bench.memory.png")
    assert report.write_other_png(plots.plot_memory, summary, path) == path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"workers": (0, 2)}, "workers"),
        ({"hidden_units": ()}, "hidden_units"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"steps": 0}, "steps"),
        ({"threads_per_worker": 0}, "threads_per_worker"),
        ({"zero_stage": 3}, "option"),
        ({"cap": "yes"}, "cap"),
        ({"workloads": ("mlp", "bert")}, "workloads"),
        ({"gpt": {**memory.GPT, "heads": 3}}, "gpt"),
        ({"gpt": {**memory.GPT, "depth": 0}}, r"gpt\['depth'\]"),
    ],
)
def test_bad_options_get_one_clear_error(options, argument):
    with pytest.raises(ValueError, match=rf"Invalid value for argument `{argument}`. Received: "):
        memory.run(**options)


def test_the_cap_is_unsharded_peak_and_each_launch_trains_or_runs_out_of_memory(
    summary, monkeypatch
):
    per_workers = summary["workloads"]["mlp"]["per_workers"]
    high, low = 20000 + 2000, 14000 + 2000  # the worst workers' peaks, unsharded and gradients
    assert memory_cap.caps_of(per_workers) == (
        2,
        [int((high - k * (high - low) / 4) // 2**20) for k in range(4)],
    )
    assert memory_cap.cap_env(500) == {
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
        "TF_CPU_BFC_MEM_LIMIT_IN_MB": "500",
    }
    assert memory_cap.outcome(None) == "trained"
    oom = RuntimeError("bench tasks exited 1: ResourceExhaustedError: OOM when allocating")
    assert memory_cap.outcome(oom) == "out of memory"
    # Any other failure is recorded (the bench's other results kept), and shows nothing.
    assert memory_cap.outcome(RuntimeError("worker:1 killed by SIGSEGV")) == memory_cap.FAILED

    calls = []

    def run_tasks(spec, *, workers, extra_env, preload):
        calls.append((spec["sharding"], workers, extra_env, preload))
        if spec["sharding"] is None and len(calls) > 1:  # out of memory under the second cap
            raise oom

    monkeypatch.setattr(memory_cap.cluster_run, "run_tasks", run_tasks)
    # The MLP here has no "parameters" launch: only the demonstration of "gradients".
    shown = memory_cap.demonstrate({"kind": "memory"}, per_workers, "mlp")
    assert [c[0] for c in calls] == [None, None, "gradients"] and not any(c[3] for c in calls)
    assert calls[1][2] == calls[2][2]  # gradients under the cap that unsharded ran out under
    cap = shown["cap"]["gradients"]
    assert cap["outcomes"] == {"unsharded": "out of memory", "gradients": "trained"}
    key = "mlp_gradients_cap_shown_ratio"
    assert (
        shown[key] == 1.0
        and shown["goals"] == {key: ">= 1"}
        and list(shown["cap"]) == ["gradients"]
    )
    assert "unsharded out of memory, gradients trained" in shown["words"][key]


def test_under_the_cap_that_gradients_runs_out_under_parameters_trains(summary, monkeypatch):
    per_workers = summary["workloads"]["gpt"]["per_workers"]
    high, low = 14000 + 2000, 8000 + 2000  # the worst workers' peaks, gradients and parameters
    assert memory_cap.caps_of(per_workers, "gradients", "parameters") == (
        2,
        [int((high - k * (high - low) / 4) // 2**20) for k in range(4)],
    )
    calls = []
    oom = RuntimeError("bench tasks exited 1: ResourceExhaustedError: OOM when allocating")

    def run_tasks(spec, *, workers, extra_env, preload):
        calls.append(spec["sharding"])
        # Unsharded always runs out; "gradients" trains once, then runs out.
        if spec["sharding"] is None or (
            spec["sharding"] == "gradients" and calls.count("gradients") > 1
        ):
            raise oom

    monkeypatch.setattr(memory_cap.cluster_run, "run_tasks", run_tasks)
    shown = memory_cap.demonstrate({"kind": "memory", "workload": "gpt"}, per_workers, "gpt")
    # The demonstration of "gradients", then that of "parameters": "gradients" out of memory
    # first, then unsharded and "parameters" under the same cap.
    assert calls == [None, "gradients", "gradients", None, "parameters"]
    cap = shown["cap"]["parameters"]
    assert cap["outcomes"] == {
        "gradients": "out of memory",
        "unsharded": "out of memory",
        "parameters": "trained",
    }
    assert cap["shown"] and shown["gpt_parameters_cap_shown_ratio"] == 1.0
    assert shown["goals"] == {
        "gpt_gradients_cap_shown_ratio": ">= 1",
        "gpt_parameters_cap_shown_ratio": ">= 1",
    }
    words = shown["words"]["gpt_parameters_cap_shown_ratio"]
    assert "unsharded out of memory, gradients out of memory, parameters trained" in words


def test_the_flags_reach_the_benchmark_and_it_runs_only_when_named():
    for flags, argument in (
        ({"threads_per_worker": 0}, "threads_per_worker"),
        ({"memory_workloads": ("gpt2",)}, "workloads"),
    ):
        common.set_options(flags)
        try:
            with pytest.raises(ValueError, match=f"`{argument}`"):
                common.registry()["memory"](1, True)
        finally:
            common.set_options(None)
    assert "memory" in runner.ON_REQUEST and "memory" in runner.available()
