"""Balanced batches (tfdist/training/balance/balancer.py, control.py): the decisions on
recorded-like rate traces, no retrace on a new split, and the refusals, in process. The real
runs (2 MultiWorkerMirrored workers, exact against one device across forced splits; a real
noisy neighbour) are in tests/strategies/test_multi_worker.py and
tests/strategies/test_balance_launch.py."""

import logging
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.training.balance.balancer import (
    Balancer,
    balance_options,
    balanced_start,
    enable_balance,
)
from tfdist.training.balance.control import SplitController, Window, proportional  # noqa: F401

G = 256


def _trace(speeds, windows, *, noise=0.05, spikes=0.1, overhead=0.3, seed=0, controller=None):
    """Feeds a recorded-like rate trace: worker w's compute per update at share n in window k is
    ``(overhead + (1 - overhead) n / 128) * 12.8 ms / speeds(k)[w]``, times a Gaussian noise and,
    in a ``spikes`` fraction of windows, a 1.5x burst. Returns (controller, shares per window,
    the decisions)."""
    controller = controller or SplitController(G, 2)
    rng = np.random.default_rng(seed)
    seen, decisions = [], []
    for k in range(windows):
        computes = []
        for n, speed in zip(controller.shares, speeds(k)):
            c = (overhead + (1 - overhead) * n / 128) * 12.8e-3 / speed
            c *= (1 + noise * rng.standard_normal()) * (1.5 if rng.uniform() < spikes else 1.0)
            computes.append(c)
        decision = controller.decide([Window(32, 32 * c, 32 * max(computes)) for c in computes])
        decisions += [decision] if decision else []
        seen.append(list(controller.shares))
    return controller, seen, decisions


def _ideal_slow_share(speed, overhead=0.3):
    """worker:1's share when both compute alike, worker:1 at ``speed`` (the trace's model)."""
    # overhead + (1 - o) n0 / 128 = (overhead + (1 - o) n1 / 128) / speed, n0 + n1 = 256
    o = overhead
    return 128 * (speed * (o + 2 * (1 - o)) - o) / ((1 - o) * (1 + speed))


def test_a_noisy_even_pair_stays_even():
    """1,000 updates (31 windows of 32) of an even pair with 5% noise and 1.5x bursts in a
    tenth of the windows: at most 2 changes, in each of 20 traces."""
    for seed in range(20):
        _, seen, decisions = _trace(lambda k: (1.0, 1.0), 31, seed=seed)
        assert len(decisions) <= 2, (seed, seen)


def test_a_step_change_converges_within_a_few_windows_and_holds():
    """worker:1 drops to half speed at window 10: the split reaches the one the rates call for
    (a fixed third of each update does not shrink with the share) by window 18, and holds."""
    controller, seen, decisions = _trace(lambda k: (1.0, 1.0 if k < 10 else 0.5), 40)
    assert seen[9] == [128, 128]
    ideal = _ideal_slow_share(0.5)  # 67 examples
    assert all(abs(s[1] - ideal) <= 0.05 * 128 for s in seen[18:]), seen
    assert len(decisions) <= 3 and all(d.reason == "balance" for d in decisions), decisions
    assert all(d.gain > d.cost for d in decisions)  # each paid more than it cost
    # and back when it recovers (window 40 on): near even within a few windows
    _, seen, _ = _trace(lambda k: (1.0, 1.0), 12, controller=controller, seed=1)
    assert abs(seen[-1][1] - 128) <= 0.05 * 128, seen


def test_a_slow_drift_is_followed():
    """worker:1 slows from 1.0x to 0.5x over 60 windows: the split follows, one way."""
    _, seen, _ = _trace(lambda k: (1.0, 1.0 - 0.5 * min(k, 60) / 60), 70, noise=0.03)
    slow = [s[1] for s in seen]
    assert slow == sorted(slow, reverse=True), slow  # never back
    assert abs(slow[-1] - _ideal_slow_share(0.5)) <= 0.06 * 128, slow


def test_a_split_that_does_not_pay_goes_back_to_even_and_waits_longer_each_time():
    """worker:1 takes a fixed 25 ms per update whatever its share (it waits, not computes)."""
    controller, seen, decisions = _trace(lambda k: (1.0, 0.5), 40, overhead=1.0, spikes=0)
    reasons = [d.reason for d in decisions]
    assert reasons[:4] == ["balance", "even", "balance", "even"], (reasons, seen)
    back = decisions[1]
    assert back.shares == [128, 128] and back.judged.worker == 1
    assert back.judged.after > back.judged.predicted
    assert [d.judged.backoff for d in decisions if d.judged][:3] == [2, 4, 8][
        : reasons.count("even")
    ]
    evens = [k for k in range(1, 40) if seen[k] == [128, 128] and seen[k - 1] != [128, 128]]
    assert evens[1] - evens[0] > 0 and len(evens) == reasons.count("even")


def test_the_floor_bounds_a_very_slow_worker():
    _, seen, _ = _trace(lambda k: (1.0, 0.01), 6, overhead=0.0, spikes=0)
    assert seen[-1] == [224, 32]  # a quarter of the even 128


def test_options_and_argument():
    assert balance_options(False) is None and balance_options(None) is None
    assert balance_options(True) == tfdist.BalanceOptions()
    options = tfdist.BalanceOptions(splits=[(5, [4, 12]), (0, (8, 8))])
    assert options.splits == ((0, (8, 8)), (5, (4, 12)))


def test_auto_steps_per_execution_is_not_cut_to_the_balance_window():
    """A balanced run takes the even run's calls: its windows end at call boundaries."""
    from tfdist.training.fit.arguments import steps_per_execution_for

    runner = types.SimpleNamespace(auto_steps_per_execution=32)
    assert steps_per_execution_for("auto", [], runner=runner) == 32
    assert steps_per_execution_for(16, [], runner=runner) == 16  # as given


def test_a_new_split_retraces_nothing():
    """The shares are a variable the compiled loop reads: a new split takes effect on the next
    call of the same trace (2 replicas in this process stand for the 2 workers)."""
    from tfdist.strategies.balanced_split import BalancedSplit
    from tfdist.strategies.base import LoopOptions
    from tfdist.strategies.sync import SyncRunner

    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    runner = SyncRunner(strategy)
    runner.balanced = BalancedSplit(strategy, 2, 1)
    runner.balanced.set([8, 8])
    x = np.arange(64, dtype=np.float32).reshape(-1, 1)
    data = types.SimpleNamespace(
        dataset_fn=None, dataset=tf.data.Dataset.from_tensor_slices(x).batch(16).repeat()
    )

    def replica_fn(batches):  # replica r's examples, weighed r + 1
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(tf.shape(batches[0])[0] * (rid + 1), tf.float32)

    loop = LoopOptions("train_function", outputs=True)
    fn = runner.compile_loop(replica_fn, lambda last: {"weighed": last}, loop)
    iterator = runner.make_iterator(runner.balanced.distribute(data))
    means = []
    for shares in ([8, 8], [4, 12], [13, 3]):
        runner.balanced.set(shares)
        means.append(runner.fetch(runner.run(fn, iterator, 2))["weighed"])
    assert means == [12.0, 14.0, 9.5]  # (n0 + 2 n1) / 2: each split taken
    assert fn.experimental_get_tracing_count() == 1
    assert runner.balanced.clock.take()["updates"] == 6  # timed, 2 updates a call


class _Runner(types.SimpleNamespace):
    """What `enable_balance` asks of a runner, without a cluster (a `BalancingRunner`)."""

    balanced = None

    def enable_balance(self):
        clock = types.SimpleNamespace(enabled=True)
        self.balanced = types.SimpleNamespace(workers=2, local_replicas=1, clock=clock)
        return self.balanced


def _own_step_model():
    class OwnStep(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inputs = keras.Input((4,))
    return OwnStep(inputs, keras.layers.Dense(2)(inputs))


@pytest.mark.parametrize(
    "model, pipeline, fragment",
    [
        (_own_step_model, None, "has its own train_step"),
        (
            lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
            "stages",
            "pipeline",
        ),
    ],
)
def test_refusals_a_runner_cannot_tell(model, pipeline, fragment):
    runner = _Runner(balance_refusal=None, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    with pytest.raises(ValueError, match=f"Invalid value for argument `balance`.*{fragment}"):
        enable_balance(tfdist.BalanceOptions(), runner, model(), pipeline)


def test_measured_balance_under_op_determinism_is_refused_fixed_splits_are_not(monkeypatch):
    from tfdist import _compat

    monkeypatch.setattr(_compat, "op_determinism_enabled", lambda: True)
    runner = _Runner(balance_refusal=None, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"`balance`.*forbids tf.timestamp.*splits=") as e:
        enable_balance(tfdist.BalanceOptions(), runner, model, None)
    assert str(e.value).count("Invalid value") == 1
    fixed = tfdist.BalanceOptions(splits=((0, (4, 12)),))
    assert enable_balance(fixed, runner, model, None) is fixed
    assert runner.balanced.clock.enabled is False  # fixed splits: nothing timed


def test_one_worker_has_nothing_to_balance(caplog):
    runner = _Runner(balance_refusal=None, loop_tasks=["worker:0"], is_chief=True)
    with caplog.at_level(logging.WARNING, logger="tfdist.training.balance.balancer"):
        assert enable_balance(tfdist.BalanceOptions(), runner, keras.Sequential(), None) is None
    assert "one worker, nothing to balance" in caplog.text


def test_data_of_unknown_length_is_refused():
    runner = _Runner(balance_refusal=None, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    runner.enable_balance()
    with pytest.raises(ValueError, match="`steps_per_epoch`.*a positive integer with balance="):
        balanced_start(None, tfdist.BalanceOptions(), runner, None, None, [], None)


def test_a_fixed_split_must_fit_the_global_batch():
    runner = _Runner(balance_refusal=None, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    runner.enable_balance()
    options = tfdist.BalanceOptions(splits=[(0, (10, 10))])
    with pytest.raises(
        ValueError, match=r"2 shares \(multiples of 1\) summing to the global batch 64"
    ):
        Balancer(options, runner, 64, None)


def test_mirrored_is_refused_by_its_runner():
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    with pytest.raises(ValueError, match="balance splits the global batch between the workers"):
        tfdist.Trainer(
            lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
            strategy=strategy,
            loss="mse",
            balance=True,
        )
    assert tf.distribute.has_strategy() is False


def test_each_new_split_is_logged_and_written_as_scalars(tmp_path, caplog):
    from tfdist.strategies.step_clock import StepClock
    from tfdist.training.balance.control import Decision, Judged

    split = types.SimpleNamespace(
        workers=2, local_replicas=1, clock=StepClock(), set=lambda s: None
    )
    runner = _Runner(balanced=split, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    balancer = Balancer(tfdist.BalanceOptions(), runner, 256, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tfdist.training.balance.balancer"):
        balancer._apply(
            Decision([168, 88], "balance", [1000.0, 520.0], 0.02, 0.0045, 0.0013, 0.0003, 5)
        )
        judged = Judged(1, 0.02, 0.0134, 0.0199, 4)
        balancer._apply(Decision([128, 128], "even", [1000.0, 990.0], judged=judged))
        balancer._apply(Decision([100, 156], "fixed", []))
    assert (
        "Balance: worker:0 takes 168, worker:1 takes 88 of every global batch of 256 "
        "(worker:0 computes at 1.00x, worker:1 computes at 0.52x the fastest's rate; predicted "
        "gain 4.50 ms of 20.00 ms compute per update, cost of moving 1.30 ms: hysteresis 1.00 + "
        "noise band 0.30, medians of 5 windows)."
    ) in caplog.text
    assert (
        "back to the even split (worker:0 takes 128, worker:1 takes 128 of 256): a smaller share "
        "was to cut worker:1's compute from 20.0 to 13.4 ms per update, and it computed 19.9 ms"
    ) in caplog.text
    assert "trying again in 4 windows" in caplog.text
    fixed = "worker:0 takes 100, worker:1 takes 156 of every global batch of 256 (a fixed split)"
    assert fixed in caplog.text
    tags = set()
    for path in (tmp_path / "balance").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(v.tag for v in event.summary.value)
    assert {"balance/share/worker_1", "balance/examples_per_second/worker_0"} <= tags
