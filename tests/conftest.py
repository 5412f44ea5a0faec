"""Test session setup: quiet TF and split the CPU into virtual devices.

Virtual devices must exist before TensorFlow initialises its devices, so this
runs at import time, before any test imports tfdist's strategies.
"""

import faulthandler
import gc
import os
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.pop("TF_CONFIG", None)

import pytest  # noqa: E402

# The CPU-seconds this process spends importing TF, Keras and tfdist: the report header prints
# them as a speed figure of the machine that day (the suite's cost is mostly such start-ups).
_IMPORT_STARTED = os.times()

import tensorflow as tf  # noqa: E402

NUM_VIRTUAL_DEVICES = 4
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_VIRTUAL_DEVICES
)

# The modules every in-process test uses, imported once, then frozen out of Python's garbage
# collection: each full collection otherwise walks TF's, Keras's and tfdist's hundreds of
# thousands of module-level objects again. On 2026-12-02 (Intel Xeon, 2 cores), test_trainer
# and test_exchange in one process took 109 user CPU-s frozen against 120 not (4.7 -> 2.8 s in
# collections, and fewer of them), test_inputs and test_parity 115-123 s wall against 138-150.
import keras  # noqa: E402, F401

import tfdist  # noqa: E402, F401

_IMPORT_CPU_SECONDS = sum(os.times()[:2]) - sum(_IMPORT_STARTED[:2])
gc.collect()
gc.freeze()

# Scheduling under ``--dist loadscope`` (one scope = one module, run by one xdist worker).
#
# * Tests that start a local Ray cluster run in one worker, one after another. Ray gives its
#   raylet 30 s (hard-coded) to register, and two clusters starting at once on 2 busy cores can
#   miss that. So the Ray notebook joins tests/ray's scope and runs after that module, whose
#   cluster is shut down by then (module fixtures end before the next module's tests).
# * The Ray module goes first, and only light in-process modules run beside it (the next three
#   in the queue go to the other worker while Ray's one module runs). Ray starts four worker
#   groups side by side (eight TensorFlow processes); with a multi-process module beside it, TF's
#   10 s coordination heartbeats were missed (seen: "heartbeat timeout" in Ray's and in
#   Slurm's jobs, both started in that minute).
# * tests/bench/test_bench.py then goes into a process that built no parameter-server cluster:
#   its benchmarks build local strategies and models in-process, and once an earlier module in
#   the same process connected to an in-process parameter-server cluster and left TF state
#   behind, they failed with "/job:localhost/replica:0/task:0/device:CPU:0 unknown device" (seen
#   once, in a 3-worker run). Its own cluster benchmark runs last in it.
# * Then the longest scopes (xdist orders by test count), so that the run does not end with one
#   worker still in a long module while the other idles.
RAY_SCOPE = "tests/ray/test_ray.py"
RAY_NOTEBOOK = "tests/test_notebooks.py::test_notebook_runs[06_ray.ipynb]"
FIRST_SCOPES = (
    RAY_SCOPE,
    "tests/test_cli.py",
    "tests/keras_parity/test_parity.py",
    "tests/training/test_trainer.py",
    "tests/bench/test_bench.py",
    "tests/slurm/test_slurm.py",
    "tests/test_notebooks.py",
    "tests/bench/test_scaling.py",
    "tests/training/backup/test_backup_faults.py",
    "tests/strategies/test_ps_multiprocess.py",
    "tests/strategies/test_multi_worker.py",
    "tests/keras_parity/test_parity_multi_worker.py",
)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from tests.xdist_scheduling import scheduler

    return scheduler(config, log, first=FIRST_SCOPES, aliases={RAY_NOTEBOOK: RAY_SCOPE})


# CPU seconds per test (this process and the children it waited for, setup and teardown
# included), as the junit property ``cpu_seconds``: what a test costs on a 2-core machine,
# where wall time mostly says what ran beside it.
_CPU_STARTED = "_tfdist_cpu_started"


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


# An in-process test whose process stops using the CPU (under STALL_CPU_SECONDS in the last
# STALL_SECONDS of wall time) has the stacks of its threads taken, once; the run's summary prints
# them ("tfdist stall" sections). Suite runs on 2026-12-02 and 12-03 each had one or two
# in-process tests (test_inputs, test_accumulation, test_options, test_backup_callback,
# test_overrides) spend 15-60 s on little CPU while a core was free; alone, none did. A 40-s
# timer caught one of them; this watches for the condition itself.
STALL_SECONDS = 8.0
STALL_CPU_SECONDS = 0.5
STALL_SECTION = "tfdist stall"
_STALL_STACKS = "_tfdist_stall_stacks"
_OUT_OF_PROCESS = {"multiprocess", "fault", "notebook", "ray", "slurm", "slow"}


class _GcClock:
    """Python's garbage collections in this process since :meth:`reset`: count, total, longest."""

    def __init__(self) -> None:
        self.reset()
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.count, self.total, self.longest, self._started = 0, 0.0, 0.0, None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took = time.perf_counter() - self._started
            self.count, self.total = self.count + 1, self.total + took
            self.longest, self._started = max(self.longest, took), None

    def running(self) -> bool:
        return self._started is not None

    def __str__(self) -> str:
        return f"{self.count} collections, {self.total:.2f} s in all, longest {self.longest:.2f} s"


_GC = _GcClock()


def _threads_in_the_kernel() -> str:
    """Each thread's scheduler state (R running, S sleeping, D disk), CPU seconds and wait
    channel, from /proc: a block on little CPU shows as S in a futex or poll."""
    lines, tick = [], os.sysconf("SC_CLK_TCK")
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        lines.append(f"  thread {tid}: {fields[0]} {cpu:.1f} CPU-s wchan {wchan}")
    return "\n".join(lines)


def _take_stacks(item, seconds: float, cpu: float) -> None:
    with tempfile.TemporaryFile("w+") as f:
        f.write(
            f"{item.nodeid}: {cpu:.2f} CPU-s in the last {seconds:.0f} s of wall time "
            f"(pid {os.getpid()})\n"
        )
        f.write(f"garbage collection during the test so far: {_GC}\n")
        f.write(f"a collection in progress now: {'yes' if _GC.running() else 'no'}\n")
        f.write(f"threads in the kernel:\n{_threads_in_the_kernel()}\n")
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        setattr(item, _STALL_STACKS, f.read())


class _StallWatch:
    """One daemon thread: samples this process's CPU time every second while an in-process test
    runs, and takes that test's stacks once if the last STALL_SECONDS used under
    STALL_CPU_SECONDS of it."""

    def __init__(self) -> None:
        self.item, self.samples = None, []
        self.lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True, name="tfdist-stall-watch").start()

    def watch(self, item) -> None:
        with self.lock:
            self.item, self.samples = item, []
        _GC.reset()

    def stop(self) -> None:
        with self.lock:
            self.item = None

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                item = self.item
                if item is None or hasattr(item, _STALL_STACKS):
                    continue
                now = (time.monotonic(), time.process_time())
                self.samples.append(now)
                old = [s for s in self.samples if now[0] - s[0] >= STALL_SECONDS]
                if not old:
                    continue
                start = old[-1]
                self.samples = self.samples[self.samples.index(start) :]
                cpu = now[1] - start[1]
                # A test waiting for a process it started (its CPU is not this process's) is not
                # blocked.
                if cpu < STALL_CPU_SECONDS and not _has_children():
                    _take_stacks(item, now[0] - start[0], cpu)


def _has_children() -> bool:
    """Whether this process has a child other than the shared preloaded Python, which idles."""
    from tests import shared_preload

    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                if set(f.read().split()) - {str(shared_preload.pid())}:
                    return True
    except OSError:
        return True  # Cannot tell: say nothing rather than a false alarm.
    return False


_STALLS = _StallWatch()


def _watch_for_a_stall(item) -> None:
    if not _OUT_OF_PROCESS & {mark.name for mark in item.iter_markers()}:
        _STALLS.watch(item)


def pytest_terminal_summary(terminalreporter):
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, text in getattr(report, "sections", ()):
                if name == STALL_SECTION:
                    terminalreporter.write_sep("-", STALL_SECTION)
                    terminalreporter.write_line(text)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    from tests import shared_preload

    shared_preload.ready(item)  # before the stall watch: the wait is for another process
    _watch_for_a_stall(item)
    setattr(item, _CPU_STARTED, _cpu_now())
    # When each test started (Unix time), so that a run's timeline across xdist workers can be
    # drawn from the junit report: which modules overlapped, and where a worker idled.
    item.user_properties.append(("started_unix", round(time.time(), 1)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "teardown":
        _STALLS.stop()
    if call.when == "teardown" and hasattr(item, _CPU_STARTED):
        item.user_properties.append(
            ("cpu_seconds", round(_cpu_now() - getattr(item, _CPU_STARTED), 2))
        )
    outcome = yield
    if call.when == "teardown" and hasattr(item, _STALL_STACKS):
        text = f"{getattr(item, _STALL_STACKS)}\nby the test's end: garbage collection {_GC}\n"
        outcome.get_result().sections.append((STALL_SECTION, text))


def pytest_report_header(config):
    """The machine at the top of the run, so that suite times can be compared across machines."""
    from tfdist.bench.in_process.bf16_vs_fp32 import BF16_CPU_FLAGS, VECTOR_CPU_FLAGS, cpu_features

    features = cpu_features()
    flags = [name for name in (*VECTOR_CPU_FLAGS, *BF16_CPU_FLAGS) if features[name]]
    return (
        f"machine: {features['model_name'] or 'unknown CPU'}, "
        f"{len(os.sched_getaffinity(0))} usable cores; CPU flags: {', '.join(flags) or 'none of '}"
        f"{'' if flags else ', '.join((*VECTOR_CPU_FLAGS, *BF16_CPU_FLAGS))}; "
        f"oneDNN {'on' if features['onednn_enabled'] else 'off'}; importing TensorFlow, Keras "
        f"and tfdist took {_IMPORT_CPU_SECONDS:.1f} CPU-s"
    )


def pytest_collection_finish(session):
    """Launches with ``--preload`` fork from one shared Python (``tests/shared_preload.py``)."""
    from tests import shared_preload

    if shared_preload.wanted(session.config, session.items):
        shared_preload.start()


def pytest_unconfigure(config):
    from tests import shared_preload

    shared_preload.stop()
    _end_child_processes()


# Every process a test forked through multiprocessing ends with the session. A PyDataset read by
# processes (``use_multiprocessing=True``) keeps Keras's pool of forked readers until its pass's
# iterator is deleted, on tfdist's release thread, and at exit the interpreter waits for such
# deletions (``tfdist.data.release``). xdist kills a worker still exiting after 10 s, and its
# readers then lived on, reparented to init (seen: one of 630 MB after a full run, started by
# the parity row ``py_dataset_processes_steps_per_epoch``). So they end here, before the exit:
# those the release thread has not stopped within a few seconds are terminated, and named.
CHILD_GRACE_SECONDS = 3.0


def _end_child_processes() -> None:
    import multiprocessing
    import sys

    from tfdist.data import release

    if multiprocessing.active_children():
        release.drain(CHILD_GRACE_SECONDS)  # a stopped pass stops its readers itself
    survivors = multiprocessing.active_children()
    for child in survivors:
        child.terminate()
    for child in survivors:
        child.join(CHILD_GRACE_SECONDS)
        if child.is_alive():
            child.kill()  # it ignored SIGTERM (an inherited handler that only notes it)
            child.join(CHILD_GRACE_SECONDS)
    if survivors:
        names = ", ".join(f"{c.name} (pid {c.pid})" for c in survivors)
        print(
            f"tfdist tests: ended {len(survivors)} child process(es) left running: {names}",
            file=sys.stderr,
        )


# In-process parameter-server clusters end with their module. TF's coordinator keeps a thread
# per worker (and one that watches for failures) for as long as its strategy lives, and a
# module-scoped strategy is not freed when its module ends. Left running, a later module's load
# made one such thread rebuild a per-worker iterator of a finished module, and the xdist process
# died in it (a segfault in ``_create_per_worker_iterator``, seen once beside the stragglers
# bench). So every coordinator made in a module is stopped when the module ends.
_COORDINATORS: list = []


def _record_coordinators() -> None:
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    cls = cluster_coordinator.ClusterCoordinator
    if getattr(cls, "_tfdist_tests_record", False):
        return
    init = cls.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)  # Called again for each ClusterCoordinator(strategy).
        if all(known is not self for known in _COORDINATORS):
            _COORDINATORS.append(self)

    cls.__init__ = recording_init
    cls._tfdist_tests_record = True


@pytest.fixture(scope="module", autouse=True)
def _stop_parameter_server_coordinators():
    _record_coordinators()
    yield
    while _COORDINATORS:
        _COORDINATORS.pop()._cluster.stop()
