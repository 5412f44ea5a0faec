"""Balanced batches (tfdist/training/balance/balancer.py, balance_control.py): the decisions and the
refusals, in process. The real runs (2 MultiWorkerMirrored workers, exact against one device
across forced splits; a real noisy neighbour) are in tests/strategies/test_multi_worker.py
and tests/strategies/test_balance_launch.py."""

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
from tfdist.training.balance.control import SplitController, Window, proportional

G = 256


def _windows(computes, shares, updates=32):
    """One window per worker whose compute seconds per example are ``computes[w]``."""
    return [
        Window(updates, updates * c * n, updates * (c * max(shares)))
        for c, n in zip(computes, shares)
    ]


def _run(controller, per_example, windows):
    """Feeds ``windows`` windows where worker w's compute per update is ``per_example[w](n)``;
    returns the shares after each."""
    seen = []
    for _ in range(windows):
        computes = [f(n) / n for f, n in zip(per_example, controller.shares)]
        controller.decide(_windows(computes, controller.shares))
        seen.append(list(controller.shares))
    return seen


def test_proportional_sums_to_the_total_in_units_above_the_floor():
    assert proportional(256, [1.0, 1.0]) == [128, 128]
    assert proportional(256, [2.0, 1.0]) == [171, 85]
    assert proportional(256, [1.0, 1.0, 1.0]) == [86, 85, 85]
    assert proportional(256, [100.0, 1.0], floor=32) == [224, 32]
    shares = proportional(256, [3.0, 1.0, 1.0, 1.0], unit=2, floor=40)
    assert sum(shares) == 256 and all(s % 2 == 0 and s >= 40 for s in shares), shares
    with pytest.raises(ValueError, match="cannot give"):
        proportional(8, [1.0, 1.0, 1.0], floor=4)


def test_an_even_pair_keeps_the_even_split_through_noise():
    controller = SplitController(G, 2)
    rng = np.random.default_rng(0)
    for _ in range(40):  # +-4% noise on each worker's compute
        noisy = [1e-4 * (1 + 0.04 * rng.uniform(-1, 1)) for _ in range(2)]
        assert controller.decide(_windows(noisy, controller.shares)) is None
    assert controller.shares == [128, 128]


def test_a_worker_at_half_speed_gets_a_third_and_back_when_it_recovers():
    controller = SplitController(G, 2)
    slow = [lambda n: 1e-4 * n, lambda n: 2e-4 * n]
    seen = _run(controller, slow, 4)
    assert seen[0] == [128, 128]  # the first window holds the traces
    assert seen[1] == [171, 85], seen  # worker:1 computes at 0.5x
    assert seen[-1] == [171, 85]  # judged: the slowest's compute fell 33%, so it stays
    even = [lambda n: 1e-4 * n, lambda n: 1e-4 * n]
    assert _run(controller, even, 3)[-1] == [128, 128]  # halfway (the smoothing), then even


def test_a_split_that_does_not_pay_goes_back_to_even_and_waits_longer_each_time():
    """worker:1 takes a fixed 20 ms per update whatever its share (a latency, not compute)."""
    controller = SplitController(G, 2)
    latency = [lambda n: 1e-4 * n, lambda n: 0.02]
    seen = _run(controller, latency, 3)
    assert seen[1] != [128, 128] and seen[2] == [128, 128], seen  # tried, judged, back
    assert controller.backoff == 2
    seen = _run(controller, latency, 4)
    assert seen[:2] == [[128, 128]] * 2 and seen[2] != [128, 128] and seen[3] == [128, 128]
    assert controller.backoff == 4


def test_the_floor_bounds_a_very_slow_worker():
    controller = SplitController(G, 2, floor=0.25)
    seen = _run(controller, [lambda n: 1e-4 * n, lambda n: 1e-2 * n], 2)
    assert seen[-1] == [224, 32]  # a quarter of the even 128


def test_options_and_argument():
    assert balance_options(False) is None and balance_options(None) is None
    assert balance_options(True) == tfdist.BalanceOptions()
    options = tfdist.BalanceOptions(splits=[(5, [4, 12]), (0, (8, 8))])
    assert options.splits == ((0, (8, 8)), (5, (4, 12)))


def test_auto_steps_per_execution_runs_at_most_a_window_per_call():
    """A balanced run decides between calls: "auto" must not run more updates than a window."""
    from tfdist.training.fit.arguments import steps_per_execution_for

    runner = types.SimpleNamespace(auto_steps_per_execution=32)
    small, large = tfdist.BalanceOptions(window=8), tfdist.BalanceOptions(window=64)
    assert steps_per_execution_for("auto", [], runner=runner, balance=small) == 8
    assert steps_per_execution_for("auto", [], runner=runner, balance=large) == 32
    assert steps_per_execution_for("auto", [], runner=runner) == 32
    assert steps_per_execution_for(16, [], runner=runner, balance=small) == 16  # as given


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
    from tfdist.training.balance.control import Decision

    split = types.SimpleNamespace(
        workers=2, local_replicas=1, clock=StepClock(), set=lambda s: None
    )
    runner = _Runner(balanced=split, loop_tasks=["worker:0", "worker:1"], is_chief=True)
    balancer = Balancer(tfdist.BalanceOptions(), runner, 256, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tfdist.training.balance.balancer"):
        balancer._apply(Decision([168, 88], "balance", [1000.0, 520.0], 0.01, None))
        balancer._apply(Decision([128, 128], "even", [1000.0, 990.0], 0.012, 0.011))
    assert (
        "Balance: worker:0 takes 168, worker:1 takes 88 of every global batch of 256 "
        "(worker:0 computes at 1.00x, worker:1 computes at 0.52x the fastest's rate)."
    ) in caplog.text
    assert "back to the even split" in caplog.text and "12.0 ms per update" in caplog.text
    tags = set()
    for path in (tmp_path / "balance").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(v.tag for v in event.summary.value)
    assert {"balance/share/worker_1", "balance/examples_per_second/worker_0"} <= tags
