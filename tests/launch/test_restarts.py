"""Tests for tfdist.launch.restarts: the launcher's restart policy, decided without processes."""

import pytest

from tfdist.config import PREEMPTED_EXIT_CODE
from tfdist.launch.restarts import MAX_PREEMPTIONS, RestartPolicy
from tfdist.launch.tasks import Task, TaskResult


def failed(task_type, task_id=0, code=3):
    return Task(task_type, task_id), TaskResult(task_type, task_id, code, None)


@pytest.mark.parametrize("ps_mode, expected", [(False, "restart_group"), (True, "restart_task")])
def test_a_failure_restarts_the_group_or_only_a_ps_worker(ps_mode, expected):
    policy = RestartPolicy(max_restarts=1, parameter_server_mode=ps_mode)
    assert policy.decide(*failed("worker", 1), workers_left=True) == expected
    assert policy.restarts == 1
    # Restarts used up: a PS worker is given up while other workers run; otherwise the job fails.
    gone = "go_on" if ps_mode else "fail"
    assert policy.decide(*failed("worker", 1), workers_left=True) == gone
    assert policy.decide(*failed("worker", 1), workers_left=False) == "fail"
    assert policy.failure_reason(failed("worker", 1)[1]) == (
        "worker:1 exited with code 3 after 1 of 1 restarts"
    )


def test_a_failed_chief_or_ps_under_parameter_servers_restarts_the_group():
    policy = RestartPolicy(max_restarts=2, parameter_server_mode=True)
    assert policy.decide(*failed("chief"), workers_left=True) == "restart_group"
    assert policy.decide(*failed("ps"), workers_left=True) == "restart_group"
    assert policy.decide(*failed("ps"), workers_left=True) == "fail"


def test_preemptions_restart_without_using_up_max_restarts():
    policy = RestartPolicy(max_restarts=0, parameter_server_mode=False)
    for _ in range(3):
        assert policy.decide(*failed("worker", 0, PREEMPTED_EXIT_CODE), workers_left=True) == (
            "restart_group"
        )
    assert (policy.restarts, policy.preemptions) == (0, 3)
    ps = RestartPolicy(max_restarts=0, parameter_server_mode=True)
    assert ps.decide(*failed("chief", 0, PREEMPTED_EXIT_CODE), workers_left=True) == "restart_task"
    # A task that exits 75 forever is stopped at last.
    ps.preemptions = MAX_PREEMPTIONS
    assert ps.decide(*failed("chief", 0, PREEMPTED_EXIT_CODE), workers_left=True) == "fail"
    assert ps.failure_reason(failed("chief", 0, PREEMPTED_EXIT_CODE)[1]) == (
        "chief:0 exited with code 75"
    )
