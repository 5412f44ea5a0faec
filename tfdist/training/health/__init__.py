"""Stuck and slow workers: the watchdog and the straggler report, beside the loop.

Start at ``monitor`` (the fit's health thread).

- ``monitor``: the fit's health thread: the progress watchdog and the straggler report.
- ``board``: the tasks' shared board: each task's state and the alarm, by key.
- ``watchdog``: the watchdog's options, learned timeouts, and who to blame for a hang.
- ``stragglers``: which worker makes the others wait, in which section, at what cost.
"""
