"""``tfdist bench --benchmarks=language_model``'s pure parts, on made-up launches: no process.

The benchmark launches two sets of processes that train a GPT for minutes; what runs in them is
`tfdist.bench.scaling.sides.time_sides` and `tfdist.bench.time_to_accuracy.worker.fit_to_target`,
which their own benchmarks' tests run in real processes. Here: the options it refuses, where
the pipeline cuts, and that its figures (tokens/s, quiet medians, ratios, seconds and updates to
the target) follow from the records the workers write.
"""

import math

import pytest

from tfdist.bench import names, runner
from tfdist.bench.language_model import parent
from tfdist.bench.language_model.worker import LOCAL_SIDES, TO_TARGET, pipeline_cut, to_target_key

STEPS, BATCH, SEQ = 10, 4, 8
TOKENS = STEPS * BATCH * SEQ


def _records(seconds, busy_extra, workers):
    # The machine's busy CPU: every worker's own (1 s a second each) + other processes'.
    return [
        {"seconds": s, "cpu_seconds": s, "busy_cpu_seconds": (workers + extra) * s}
        for s, extra in zip(seconds, busy_extra)
    ]


def _points(bits, seconds_each=5.0):
    return [
        {"epoch": i + 1, "seconds": seconds_each * (i + 1), "wall_seconds": 6.0 * (i + 1)}
        | {"val_bits_per_byte": b, "updates": 50 * (i + 1), "learning_rate": 1e-3}
        for i, b in enumerate(bits)
    ]


def _task(seconds, bits, busy_extra, workers=1, local=None):
    points = _points(bits)
    records = {name: _records(s, busy_extra, workers) for name, s in seconds.items()}
    records[TO_TARGET] = _records([30.0], [0.0], workers)
    local = local or {}
    for side in local:
        records[to_target_key(side)] = _records([30.0], [0.5], workers)
    return {
        "steps": STEPS,
        "global_batch_size": BATCH,
        "seq_len": SEQ,
        "parameters": 1234,
        "threads": {"intra_op_threads": 2 // workers},
        "seconds": seconds,
        "updates": {name: [STEPS] * len(s) for name, s in seconds.items()},
        "records": records,
        "to_target": {"points": points, "eval_seconds": 1.0, "fit_seconds": 30.0},
        "to_target_local_sgd": {
            side: {"points": p, "eval_seconds": 1.0, "fit_seconds": 30.0}
            for side, p in local.items()
        },
    }


def _launches():
    local = {name: [1.0, 2.0, 4.0] for name in LOCAL_SIDES}
    local["trainer"] = [1.1, 2.2, 0.5]
    one = _task(local, [4.0, 3.5, 2.9, 2.5], busy_extra=[0.0, 0.0, 1.0])
    # DiLoCo H=16: twice the tokens/s, 4 evaluations (200 updates) to the target at 2 s each.
    diloco = _points([4.0, 3.6, 3.2, 2.99], seconds_each=2.0)
    two = _task(
        {"multi_worker": [2.0, 2.0, 2.0], "diloco_h16": [1.0, 1.0, 1.0]},
        [4.0, 3.4, 2.95],
        [0.0] * 3,
        workers=2,
        local={"diloco_h16": diloco},
    )
    return {
        "1": {"tasks": {"worker-0": one}, "others_cpu": 0.1, "launch_seconds": 60.0},
        "2": {"tasks": {"worker-0": two, "worker-1": two}, "others_cpu": 0.0},
    }


def test_figures_follow_from_the_records():
    spec = {**parent.DEFAULTS, "target_bits_per_byte": 3.0, "seq_len": SEQ}
    out = parent.summarise(spec, _launches())
    sides = out["sides"]
    assert set(sides) == {*LOCAL_SIDES, "multi_worker", "diloco_h16"}
    # The third fit of each side was disturbed (another process took a core): left out.
    assert sides["keras_fit"]["quiet_fits"] == sides["trainer"]["quiet_fits"] == 2
    assert sides["keras_fit"]["tokens_per_s"] == (TOKENS / 1.0 + TOKENS / 2.0) / 2
    assert sides["trainer"]["tokens_per_s"] == pytest.approx((TOKENS / 1.1 + TOKENS / 2.2) / 2)
    assert sides["multi_worker"]["quiet_fits"] == 3
    assert sides["multi_worker"]["updates_per_worker"] == {
        "worker-0": [STEPS] * 3,
        "worker-1": [STEPS] * 3,
    }
    keras = sides["keras_fit"]["tokens_per_s"]
    assert out["ratio"] == sides["trainer"]["tokens_per_s"] / keras
    for name in ("mirrored", "sharded", "pipeline", "multi_worker"):
        assert out[f"{name}_ratio"] == sides[name]["tokens_per_s"] / keras
    assert out["goals"] == {"ratio": ">= 0.95"}
    # The first evaluation at or under the target: the 3rd (150 updates, 15 s) on both.
    one, two = out["to_target"]["1"], out["to_target"]["2"]
    assert (one["updates_to_target"], one["seconds_to_target"]) == (150, 15.0)
    assert (two["updates_to_target"], two["seconds_to_target"]) == (150, 15.0)
    assert out["time_to_target_ratio"] == 1.0 and out["updates_to_target_ratio"] == 1.0
    assert "1: 15 s, 150 updates" in out["words"]["time_to_target_ratio"]
    assert out["config"]["pipeline_split_at"] == "block_0"
    assert out["others_cpu_max"] == 1.0


def test_local_sgd_sides_against_plain_keras_and_one_worker():
    spec = {**parent.DEFAULTS, "target_bits_per_byte": 3.0, "seq_len": SEQ}
    out = parent.summarise(spec, _launches())
    keras = out["sides"]["keras_fit"]["tokens_per_s"]
    assert out["diloco_h16_ratio"] == pytest.approx(TOKENS / 1.0 / keras)
    assert (
        "2 multi_worker processes, DiLoCo, outer SGD(0.7, Nesterov momentum 0.9) H=16"
        in (out["words"]["diloco_h16_ratio"])
    )
    named = {"diloco_h16_lr1_m0.5": "DiLoCo, outer SGD(1, momentum 0.5) H=16"}
    named["local_sgd_h4"] = "processes, local SGD H=4"
    for side, words in named.items():
        assert words in parent.side_words(side), parent.side_words(side)
    # DiLoCo reached 2.99 at its 4th evaluation: 200 updates, 8 s; one worker 150 updates, 15 s.
    local = out["to_target_local_sgd"]["diloco_h16"]
    assert (local["updates_to_target"], local["seconds_to_target"]) == (200, 8.0)
    assert out["diloco_h16_time_to_target_ratio"] == pytest.approx(8.0 / 15.0)
    assert out["diloco_h16_updates_to_target_ratio"] == pytest.approx(200 / 150)
    assert (
        "(8 s, 200 updates; 1: 15 s, 150 updates)"
        in (out["words"]["diloco_h16_time_to_target_ratio"])
    )
    assert local["others_cpu"] == 0.5


def test_a_target_not_reached_has_no_time():
    launches = _launches()
    spec = {**parent.DEFAULTS, "target_bits_per_byte": 2.0}
    out = parent.summarise(spec, launches)
    assert not out["to_target"]["1"]["reached"]
    assert out["to_target"]["1"]["seconds_to_target"] is None
    assert out["time_to_target_ratio"] is None
    assert "not reached in 200 updates" in out["words"]["time_to_target_ratio"]
    assert not math.isnan(out["ratio"])


def test_the_pipeline_cuts_half_the_blocks_onto_each_stage():
    assert [pipeline_cut(d) for d in (2, 3, 4, 8)] == ["block_0", "block_0", "block_1", "block_3"]


@pytest.mark.parametrize(
    "override, name",
    [
        ({"steps": 0}, "steps"),
        ({"model_options": {"width": 64, "depth": 1, "heads": 4}}, "model_options"),
        ({"model_options": {"size": 3}}, "model_options"),
        ({"global_batch_size": 12}, "global_batch_size"),  # 6 per replica, 4 micro-batches
        ({"target_bits_per_byte": 0}, "target_bits_per_byte"),
        ({"eval_every": 2000}, "eval_every"),
        ({"local_sgd": ("diloco_h0",)}, "local_sgd"),
        ({"local_sgd_to_target": ("sync",)}, "local_sgd"),
    ],
)
def test_bad_options_get_one_clear_error(override, name):
    with pytest.raises(ValueError, match=name):
        parent.check({**parent.DEFAULTS, **override})


def test_it_launches_and_runs_only_when_named():
    assert "language_model" in names.LAUNCHING and "language_model" in runner.available()
    assert "language_model" not in names.OWN_PROCESSES
