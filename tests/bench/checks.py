"""Checks the multi-process bench tests share (test_scaling.py, test_allreduce.py, ...)."""

import os

#: ``tfdist bench --preload``: the bench tests fork their benchmarks' tasks from one Python that
#: imported these, as the multi-process tests' launches do (about 5 CPU-seconds saved per task).
from tests.helpers import PRELOAD_MODULES as PRELOAD  # noqa: F401


def assert_png_written(results, output, name):
    """Benchmark ``name``'s own chart is a PNG file next to the JSON ``output``."""
    chart = results["results"][name]["chart"]
    assert chart == f"{os.path.splitext(output)[0]}.{name}.png"
    with open(chart, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def cpuinfo_first(key, path="/proc/cpuinfo"):
    """The first ``key`` line's value in /proc/cpuinfo, read apart from the bench (or None)."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def assert_machine_is_this_one(machine):
    """The result's machine block is this machine: /proc/cpuinfo's model and flags, its cores."""
    from tfdist.bench.in_process.bf16_vs_fp32 import BF16_CPU_FLAGS, VECTOR_CPU_FLAGS

    flags = cpuinfo_first("flags")
    flags = None if flags is None else set(flags.split())
    names = (*BF16_CPU_FLAGS, *VECTOR_CPU_FLAGS)
    assert {flag: machine["cpu"][flag] for flag in names} == {
        flag: None if flags is None else flag in flags for flag in names
    }
    assert machine["cpu"]["model_name"] == cpuinfo_first("model name")
    assert machine["cpu_count"] == os.cpu_count()
    assert machine["cores_usable"] == len(os.sched_getaffinity(0))
