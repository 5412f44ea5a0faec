"""``scaling``'s bytes per update of local sides, fragments included, on recorded numbers.

In process, no launch (``test_scaling.py`` holds the real launch): what the parent makes of
what a worker records (`tfdist.bench.scaling.worker`: each fit's syncs, its
``[scheduled syncs', its end's]`` bytes and each fragment's bytes).
"""

import pytest

from tfdist.bench.harness import fits
from tfdist.bench.scaling import parent as scaling


def test_a_fragment_sides_bytes_per_update_and_per_sync_follow_from_its_record():
    """H=16, K=4, fragments of 100, 10, 1 and 889 bytes (the gradient: 1000), fits of 48
    updates from update 48: 12 scheduled syncs (3 whole rounds: 3000 bytes) and the end's
    (fragments 0-2: 111 bytes). Scheduled: 1/H of synchronous; with the end's, more. A side
    recorded without bytes (K = 1) counts its syncs times the gradient's bytes."""
    assert fits.sync_bytes(48, 96, 16, [100, 10, 1, 889]) == (3000, 111)
    lead = {
        "gradient_bytes": 1000,
        "updates": {"diloco_h16_k4": [48, 48], "local_sgd_h16": [48, 48], "trainer": [48, 48]},
        "syncs": {"diloco_h16_k4": [13, 13], "local_sgd_h16": [3, 3]},
        "sync_bytes": {"diloco_h16_k4": [[3000, 111], [3000, 111]]},
        "fragment_bytes": {"diloco_h16_k4": [100, 10, 1, 889]},
    }
    sides = {name: {"examples_per_s": 100.0} for name in lead["updates"]}
    scaling.bytes_per_update(sides, lead, 2)
    local = sides["diloco_h16_k4"]
    assert local["allreduce_bytes_per_update"] == pytest.approx(3111 / 48)
    assert local["steady_allreduce_bytes_per_update"] == pytest.approx(1000 / 16)
    assert local["bytes_per_sync"] == 0.889 and local["syncs_per_measurement"] == [13, 13]
    plain = sides["local_sgd_h16"]
    assert plain["allreduce_bytes_per_update"] == plain["steady_allreduce_bytes_per_update"]
    assert plain["allreduce_bytes_per_update"] == pytest.approx(1000 / 16)
    assert plain["bytes_per_sync"] == 1.0 and sides["trainer"]["allreduce_bytes_per_update"] == 1000
    out = {"goal": ">= 0.95"}
    per_workers = {"1": {"sides": {"trainer": {"examples_per_s": 50.0}}}, "2": {"sides": sides}}
    scaling.local_headlines(out, per_workers, 2)
    assert out["diloco_h16_k4_bytes_ratio"] == pytest.approx(1 / 16)
    assert out["goals"]["diloco_h16_k4_bytes_ratio"] == "<= 0.06563"
    assert out["diloco_h16_k4_vs_one_worker_ratio"] == 2.0
    one = {name: {} for name in sides}
    scaling.bytes_per_update(one, lead, 1)
    assert one["diloco_h16_k4"]["allreduce_bytes_per_update"] == 0


def test_a_fragment_side_is_refused_where_k_does_not_divide_h_before_any_launch():
    with pytest.raises(ValueError, match=r"`local_sgd`. Received: local_sgd='diloco_h16_k5'"):
        scaling.run(workers=(2,), local_sgd=("diloco_h16_k5",))
