"""``tfdist bench --benchmarks=pipeline``, in-process and cheap: no worker process is started.

The bubble's formula, the trace's reading (made-up events, and one tiny real profile), the
cut into stages, the options' refusals, the worker's commands on a tiny Trainer (the logical
CPU devices of tests/conftest.py), and the summary's rows, goals and chart from made-up
measurements. Nothing here asserts speed: the bench measures it.
"""

import json
import math

import keras
import pytest
import tensorflow as tf

from tfdist.bench import names, runner
from tfdist.bench.harness import plots, report
from tfdist.bench.pipeline import parent as pipeline
from tfdist.bench.pipeline import trace as pipeline_trace
from tfdist.bench.pipeline import worker as pipeline_worker


@pytest.mark.parametrize(("stages", "m", "bubble"), [(2, 1, 0.5), (2, 8, 1 / 9), (4, 4, 3 / 7)])
def test_the_computed_bubble_is_gpipes(stages, m, bubble):
    assert pipeline_trace.computed_bubble(stages, m) == pytest.approx(bubble)


def test_the_computed_bubble_refuses_a_non_positive_count():
    with pytest.raises(ValueError, match=r"`micro_batches`. Received: micro_batches=0"):
        pipeline_trace.computed_bubble(2, 0)


def test_an_op_belongs_to_the_stage_its_name_scope_names():
    assert pipeline_trace.stage_of("while/body/_1/while/mlp_stage_0_3/dense_0_1/Relu") == 0
    assert pipeline_trace.stage_of("gradient_tape/mlp_stage_1/dense_4/MatMul/MatMul_1") == 1
    assert pipeline_trace.stage_of("mlp_stage_12/dense/BiasAdd") == 12
    assert pipeline_trace.stage_of("adam/Sub_3") is None
    assert pipeline_trace.stage_of("mlp_stage_1") is None  # a name, not a scope


def test_intervals_merge_and_intersect():
    merged = pipeline_trace.union([(3, 4), (0, 1), (0.5, 2), (2, 2.5)])
    assert merged == [(0, 2.5), (3, 4)]
    assert pipeline_trace.intersection(merged, [(1, 3.5)]) == [(1, 2.5), (3, 3.5)]
    assert pipeline_trace.intersection(merged, []) == []


def test_the_measured_bubbles_are_the_idle_shares_of_the_threads_and_of_each_stage():
    events = [
        ("x/m_stage_0/d/MatMul", 0.0, 2.0),
        ("x/m_stage_0/d/Relu", 1.0, 3.0),  # overlaps its own stage: counted once
        ("gradient_tape/m_stage_0/d/MatMul", 5.0, 6.0),
        ("x/m_stage_1/d/MatMul", 2.0, 5.0),
        ("adam/Update", 6.0, 9.0),  # no stage: outside the span
    ]
    got = pipeline_trace.measured_bubble(events, 2)
    assert got["span_s"] == 6.0 and got["busy_s"] == [4.0, 3.0] and got["ops"] == [3, 1]
    assert got["work_s"] == [5.0, 3.0]  # the threads' op seconds: both of the overlap
    assert got["bubble"] == pytest.approx(1 - 8.0 / 12.0)
    assert got["stage_bubble"] == pytest.approx(1 - 7.0 / 12.0)
    assert got["all_stages_s"] == 1.0 and got["all_stages_share"] == pytest.approx(1 / 6)


def test_a_stage_missing_from_the_trace_leaves_the_bubble_unknown():
    got = pipeline_trace.measured_bubble([("m_stage_0/d/MatMul", 0.0, 1.0)], 2)
    assert math.isnan(got["bubble"]) and math.isnan(got["stage_bubble"]) and got["ops"] == [1, 0]


def test_a_real_profile_is_read_back_with_each_stages_ops():
    a = tf.random.normal([64, 64])

    @tf.function
    def two_stages():
        with tf.name_scope("m_stage_0"):
            h = tf.matmul(a, a)
        with tf.name_scope("m_stage_1"):
            return tf.matmul(h, a)

    two_stages()
    events = pipeline_trace.profile(lambda: two_stages().numpy())
    assert events is not None, (
        "TF's profiler trace could not be read (see _compat/tf_internals/profiler.py)"
    )
    got = pipeline_trace.measured_bubble(events, 2)
    assert got["ops"][0] >= 1 and got["ops"][1] >= 1 and 0.0 <= got["bubble"] < 1.0


@pytest.mark.parametrize(
    ("layers", "stages", "split"),
    [(8, 2, ["dense_3"]), (8, 4, ["dense_1", "dense_3", "dense_5"]), (3, 2, ["dense_0"])],
)
def test_the_mlp_is_cut_into_equal_stages(layers, stages, split):
    assert pipeline.split_points(layers, stages) == split


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stages": 1}, r"`stages`. Received: stages=1. Expected 2 to 8"),
        ({"hidden_units": (64,)}, r"`stages`. Received: stages=2. Expected 2 to 1"),
        ({"micro_batches": (3,)}, r"`global_batch_size`. Received: global_batch_size=512"),
        ({"micro_batches": ()}, r"`micro_batches`. Received: micro_batches=\(\)"),
        ({"micro_batches": (0,)}, r"`micro_batches`. Received: micro_batches=0"),
        ({"steps": 0}, r"`steps`. Received: steps=0"),
        ({"learning_rate": 0}, r"`learning_rate`. Received: learning_rate=0"),
        ({"nope": 1}, r"`option`. Received: option='nope'"),
    ],
)
def test_bad_options_are_refused_before_any_process_starts(overrides, message):
    with pytest.raises(ValueError, match=message):
        pipeline.run(**overrides)


def test_the_sides_differ_in_devices_and_threads_only():
    specs = pipeline.side_specs({**pipeline.DEFAULTS, "stages": 2})
    pipe, one, threads = specs["pipeline"], specs["one_device"], specs["one_device_threads"]
    assert (threads["devices"], threads["inter_op_threads"]) == (1, 2)
    assert threads["stage_devices"] == one["stage_devices"]
    assert pipe["split_at"] == one["split_at"] == ["dense_3"]
    assert (pipe["devices"], pipe["inter_op_threads"]) == (2, 2)
    assert pipe["stage_devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert (one["devices"], one["inter_op_threads"]) == (1, 1)
    assert one["stage_devices"] == ["/device:CPU:0"] * 2
    same = {k: v for k, v in pipe.items() if k not in ("devices", "inter_op_threads")}
    assert same == {k: v for k, v in one.items() if k in same} | {
        "stage_devices": pipe["stage_devices"]
    }
    json.dumps(specs)  # sent to the workers as JSON


TINY = {
    **pipeline.QUICK,
    "num_classes": 3,
    "learning_rate": 1e-3,
    "seed": 0,
    "split_at": ["dense_0"],
    "stage_devices": ["/device:CPU:0", "/device:CPU:1"],
}


def test_the_worker_builds_times_and_profiles_a_pipeline():
    replies = []
    commands = [{"op": "build", "micro_batches": 2}, {"op": "time"}, {"op": "profile"}]
    lines = [json.dumps(c) for c in [*commands, {"op": "stop"}, {"op": "time"}]]
    pipeline_worker.serve(TINY, iter(lines), replies.append)
    built, timed, profiled, stopped = replies  # nothing after stop
    # 32-32-32-3: dense_0 on CPU:0; dense_1 and the logits on CPU:1.
    assert built["parameter_bytes"] == {"CPU:0": (32 * 32 + 32) * 4, "CPU:1": (32 * 35 + 35) * 4}
    assert built["total_parameter_bytes"] == sum(built["parameter_bytes"].values())
    assert built["largest_layer_bytes"] == (32 * 32 + 32) * 4
    # Adam's two moments follow their variables; its scalars are on CPU:0.
    assert built["optimizer_bytes"]["CPU:1"] == 2 * built["parameter_bytes"]["CPU:1"]
    assert timed["updates"] == TINY["steps"] and timed["examples_per_s"] > 0
    assert timed["seconds"] > 0 and timed["cpu_seconds"] > 0
    assert profiled["ops"][0] > 0 and profiled["ops"][1] > 0 and stopped == {"stopped": True}


def test_the_worker_refuses_an_unknown_command():
    with pytest.raises(ValueError, match="Unknown command"):
        pipeline_worker.serve(TINY, iter(['{"op": "nope"}']), lambda r: None)


def test_variable_bytes_are_counted_per_device():
    with tf.device("/device:CPU:1"):
        v = keras.Variable(tf.zeros([3, 4]))
    w = keras.Variable(tf.zeros([5], tf.float64))
    assert pipeline_worker.bytes_by_device([v, w]) == {"CPU:0": 40, "CPU:1": 48}


def _built(m):
    return {
        "micro_batches": m,
        "global_batch_size": 256,
        "parameters": 1000,
        "parameter_bytes": {"CPU:0": 1800, "CPU:1": 2200},
        "optimizer_bytes": {"CPU:0": 3608, "CPU:1": 4400},
        "total_parameter_bytes": 4000,
        "largest_layer_bytes": 500,
    }


def _entry(m, pipe_rates, one_rates, bubbles, busy=None):
    """One ``M`` as `pipeline.measure` returns it, with made-up rates and profiled bubbles (one
    device with the pipeline's threads: 1.6 times one device of one thread)."""
    busy = busy or [0.0] * len(pipe_rates)
    values = {
        "pipeline": pipe_rates,
        "one_device": one_rates,
        "one_device_threads": [1.6 * r for r in one_rates],
    }
    return {
        "built": {side: _built(m) for side in values},
        "samples": {
            "values": values,
            "cpu_share": {side: [1.0] * len(v) for side, v in values.items()},
            "others_cpu": {side: busy if side == "pipeline" else [0.0] * 3 for side in values},
            "seconds": {side: [1.0] * len(v) for side, v in values.items()},
        },
        "profiles": [{"bubble": b, "stage_bubble": 0.5, "ops": [10, 10]} for b in bubbles],
    }


@pytest.fixture(scope="module")
def summary():
    spec = pipeline.side_specs(dict(pipeline.DEFAULTS))["pipeline"]
    per_m = {
        # A busy fit (1.2 cores taken by others) is left out of the pipeline's median.
        "1": _entry(1, [1000.0, 1100.0, 100.0], [1000.0] * 3, [0.5, 0.4], busy=[0, 0, 1.2]),
        "8": _entry(8, [1200.0, 1250.0, 1300.0], [1000.0] * 3, [0.2, math.nan, 0.1]),
    }
    return pipeline.summarise(spec, per_m)


def test_each_micro_batch_count_has_its_rates_speedup_and_bubbles(summary):
    one = summary["per_micro_batches"]["1"]
    assert one["sides"]["pipeline"]["examples_per_s"] == 1050.0  # the two quiet fits
    assert one["sides"]["pipeline"]["quiet_fits"] == 2 and one["sides"]["pipeline"]["fits"] == 3
    assert one["sides"]["one_device"]["step_s"] == pytest.approx(256 / 1000)
    assert one["speedup"] == pytest.approx(1.05)
    assert one["versus_same_threads"] == pytest.approx(1.05 / 1.6)
    assert one["bubble"]["computed"] == 0.5 and one["bubble"]["profiled"] == pytest.approx(0.45)
    assert one["bubble"]["from_step_times"] == pytest.approx(1 - 1.05 / 2)
    eight = summary["per_micro_batches"]["8"]["bubble"]
    assert eight["computed"] == pytest.approx(1 / 9) and eight["profiled"] == pytest.approx(0.15)
    assert eight["profiled_per_stage"] == 0.5 and math.isnan(eight["all_stages_share"])
    assert summary["others_cpu_max"] == 1.2


def test_the_table_shows_the_goals_and_whether_they_are_met(summary):
    rows = {f["key"]: f for f in report.figures({"results": {"pipeline": summary}})}
    assert set(rows) == {
        "m1_throughput_ratio",
        "m1_same_threads_ratio",
        "m1_bubble_ratio",
        "m8_throughput_ratio",
        "m8_same_threads_ratio",
        "m8_bubble_ratio",
        "parameter_share_ratio",
    }
    assert rows["m8_throughput_ratio"]["value"] == pytest.approx(1.25)
    assert (rows["m8_throughput_ratio"]["goal"], rows["m8_throughput_ratio"]["met"]) == (
        ">= 1.3",
        False,
    )
    assert rows["m1_throughput_ratio"]["goal"] is None  # the goal is at M=8 only
    assert rows["m8_same_threads_ratio"]["goal"] is None
    # 2200 of 4000 bytes: 1.1 of a half; the bound is a half plus the largest layer (500).
    share = rows["parameter_share_ratio"]
    assert (share["value"], share["goal"], share["met"]) == (1.1, "<= 1.25", True)
    assert "computed 0.111" in rows["m8_bubble_ratio"]["words"]
    table = report.summary({"meta": {}, "results": {"pipeline": summary}})
    assert "M=8: 2 stages on 2 devices / one device, examples/s" in table


def test_the_chart_is_drawn(summary, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.pipeline.png"
    plots.plot_pipeline(report.jsonable(summary), str(path))
    assert path.stat().st_size > 0


def test_pipeline_is_registered_and_runs_only_when_named():
    assert "pipeline" in runner.available() and "pipeline" in runner.ON_REQUEST
    assert "pipeline" in names.LAUNCHING  # what the CLI lists as launching


def test_preload_is_refused_for_the_pipeline_alone():
    # Its processes are its own, not started through tfdist launch: nothing to preload into.
    with pytest.raises(
        ValueError, match=r"`preload`.*The ones that do: scaling, .*memory, language_model\."
    ):
        runner.run(["pipeline"], output=None, options={"preload": ("tensorflow",)})


def test_a_ratio_without_a_quiet_fit_on_a_side_says_so():
    spec = pipeline.side_specs(dict(pipeline.DEFAULTS))["pipeline"]
    loud = _entry(8, [1000.0] * 3, [1000.0] * 3, [0.1], busy=[1.0] * 3)
    words = pipeline.summarise(spec, {"8": loud})["words"]
    assert words["m8_throughput_ratio"].endswith("examples/s (no quiet fit: pipeline)")
    assert words["m8_same_threads_ratio"].endswith("(no quiet fit: pipeline)")
