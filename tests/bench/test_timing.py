"""``tfdist.bench.harness.timing``: alternation, extra rounds on a busy machine, clean medians
(no TF)."""

import math

from tfdist.bench.harness import timing


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
