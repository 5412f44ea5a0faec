"""``tfdist bench --benchmarks=allreduce`` at tiny sizes, 2 real worker processes: correctness only.

Bandwidths must follow from the recorded times, and every point from the sizes
asked for. Nothing here asserts speed. Apart from test_scaling.py so that
pytest-xdist (``--dist loadscope``) runs the two modules' launches side by side.
"""

import json
import statistics
import subprocess
import sys

import pytest

from tests.bench.checks import PRELOAD, assert_machine_is_this_one, assert_png_written
from tfdist.bench import runner
from tfdist.bench.allreduce import parent as allreduce

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    output = str(tmp_path_factory.mktemp("bench") / "bench.json")
    results = runner.run(
        ["allreduce"],
        quick=True,
        output=output,
        repeats=2,
        options={"threads_per_worker": 1, "preload": PRELOAD},
    )
    return results, output


def test_allreduce_bandwidths_follow_from_the_recorded_times(bench_run):
    result = bench_run[0]["results"]["allreduce"]
    n = result["num_workers"]
    assert n == 2
    assert all(t["preloaded"] for t in result["threads"].values())  # the preload option
    expected_sizes = allreduce.sizes(result["config"]["min_bytes"], result["config"]["max_bytes"])
    assert expected_sizes == [1024, 4096, 16384]
    labels = {(s["implementation"], s["packing"], s["dtype"]) for s in result["series"]}
    assert {
        ("ring", "one_tensor", "float32"),
        ("ring", "one_tensor", "bfloat16"),
        ("auto", "4_tensors_packed", "float32"),
    } <= labels
    for series in result["series"]:
        assert [p["fp32_bytes"] for p in series["points"]] == expected_sizes
        for p in series["points"]:
            itemsize = 4 if series["dtype"] == "float32" else 2
            assert p["bytes"] == p["elements"] * itemsize == p["fp32_bytes"] // 4 * itemsize
            assert len(p["samples_s"]) == result["config"]["repeats"]
            assert p["time_s"] == pytest.approx(statistics.median(p["samples_s"]))
            assert p["algbw_GBps"] == pytest.approx(p["bytes"] / p["time_s"] / 1e9)
            assert p["busbw_GBps"] == pytest.approx(p["algbw_GBps"] * 2 * (n - 1) / n)
    for name in ("numpy_copy", "tcp_loopback"):
        points = result["loopback"][name]
        assert [p["bytes"] for p in points] == expected_sizes
        assert all(p["GBps"] == pytest.approx(p["bytes"] / p["time_s"] / 1e9) for p in points)

    def ring_times(dtype):
        return {
            p["fp32_bytes"]: p["time_s"]
            for s in result["series"]
            for p in s["points"]
            if (s["implementation"], s["packing"], s["dtype"]) == ("ring", "one_tensor", dtype)
        }

    ring, ring16 = ring_times("float32"), ring_times("bfloat16")
    assert result["bf16_vs_fp32_sizes"] == [16384]  # no size >= 4 MB here: the largest
    assert result["bf16_vs_fp32_time_ratio"] == pytest.approx(ring16[16384] / ring[16384])


def test_results_and_png_are_written(bench_run):
    results, output = bench_run
    with open(output) as f:
        assert json.load(f) == json.loads(json.dumps(results))
    assert_png_written(results, output, "allreduce")
    assert_machine_is_this_one(results["results"]["allreduce"]["machine"])


def test_bad_allreduce_options_get_one_clear_error():
    with pytest.raises(ValueError, match=r"Invalid value for argument `allreduce_workers`"):
        allreduce.run(workers=1)


def test_a_preload_is_checked_and_refused_where_no_benchmark_launches_tasks():
    with pytest.raises(ValueError, match=r"preload.*'tensor flow'.*module names"):
        runner.run(["allreduce"], output=None, options={"preload": ("tensor flow",)})
    with pytest.raises(ValueError, match=r"preload.*tensorflow.*none of the benchmarks run"):
        runner.run(["accumulation"], output=None, options={"preload": ("tensorflow",)})


def test_a_process_started_afresh_is_not_taken_for_a_preloaded_one():
    from tfdist.bench.harness.worker_common import forked_from_preload

    assert not forked_from_preload()  # this test's process (the preloaded tasks: above)
    # A process whose command line is the preloaded Python's, as a task forked from it keeps.
    # It says "up" once it runs: until its exec, its command line is still this process's.
    like_a_task = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; print('up', flush=True); time.sleep(60)",
            "-m",
            "tfdist.launch._zygote",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert like_a_task.stdout.readline() == "up\n"
        assert forked_from_preload(like_a_task.pid)
    finally:
        like_a_task.kill()
        like_a_task.wait()
