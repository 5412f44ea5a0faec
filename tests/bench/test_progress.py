"""Bench progress lines: one per measurement, from the lead task only, logged by the parent."""

import io
import json
import logging

import pytest

from tfdist.bench.harness import cluster_run, timing, worker_common


def _as_task(monkeypatch, task_type, index, cluster=("worker", "worker")):
    tasks = {}
    for t in cluster:
        tasks.setdefault(t, []).append(f"localhost:{len(tasks.get(t, []))}")
    config = {"cluster": tasks, "task": {"type": task_type, "index": index}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))


def test_the_lead_task_reports_each_measurement_against_the_planned_repeats(monkeypatch, capsys):
    _as_task(monkeypatch, "worker", 0)
    monkeypatch.setattr(worker_common, "_planned_repeats", [None])
    worker_common.plan_progress({"repeats": 2})
    recorder = worker_common.Recorder(planned={"calibration": 1})
    for name in ("calibration", "trainer", "trainer", "trainer"):
        recorder.measure(name, lambda: None)
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == [
        worker_common.PROGRESS_MARK + "calibration 1/1",
        worker_common.PROGRESS_MARK + "trainer 1/2",
        worker_common.PROGRESS_MARK + "trainer 2/2",
        worker_common.PROGRESS_MARK + "trainer 3",  # past the plan: a count, no total
    ]
    assert len(recorder.records["trainer"]) == 3


@pytest.mark.parametrize(
    "task, cluster, lead",
    [
        (("worker", 1), ("worker", "worker"), False),
        (("worker", 0), ("chief", "worker", "ps"), False),
        (("chief", 0), ("chief", "worker", "ps"), True),
        (("ps", 0), ("worker", "ps"), False),
    ],
)
def test_only_the_lead_task_reports(monkeypatch, capsys, task, cluster, lead):
    _as_task(monkeypatch, *task, cluster=cluster)
    worker_common.report_progress("trainer 1/2")
    assert bool(capsys.readouterr().err) is lead


def test_a_worker_program_run_in_process_reports_as_the_lead(monkeypatch, capsys):
    monkeypatch.delenv("TF_CONFIG", raising=False)  # e.g. tests/bench/test_memory.py's worker
    worker_common.report_progress("steps 1/1")
    assert capsys.readouterr().err == worker_common.PROGRESS_MARK + "steps 1/1\n"


def test_the_parent_logs_progress_lines_and_keeps_every_line_in_the_log(caplog):
    log = io.StringIO()
    output = cluster_run.TaskOutput(log, "scaling (2 worker(s), 0 ps)")
    lines = [
        "[worker:0] " + worker_common.PROGRESS_MARK + "trainer 2/5 (3.1 s)\n",
        "[worker:1] x\n",
    ]
    with caplog.at_level(logging.INFO, logger=cluster_run.__name__):
        for line in lines:
            output.write(line)
    assert log.getvalue() == "".join(lines)
    assert [r.getMessage() for r in caplog.records] == [
        "bench scaling (2 worker(s), 0 ps): trainer 2/5 (3.1 s)"
    ]


def test_alternate_logs_one_line_per_measurement(caplog):
    def side():
        return 1.0, timing.Timing(0.5, 0.5, None)

    with caplog.at_level(logging.INFO, logger=timing.__name__):
        timing.alternate({"a": side, "b": side}, repeats=2)
    assert [r.getMessage() for r in caplog.records] == [
        "bench: a 1/2 (0.5 s)",
        "bench: b 1/2 (0.5 s)",
        "bench: b 2/2 (0.5 s)",
        "bench: a 2/2 (0.5 s)",
    ]
