"""The parameter-server runner and what it alone needs (``strategies/parameter_server.py`` builds
it).

Start at ``runner``.

- ``runner``: ``PSRunner``: schedule, fetch, join.
- ``failures``: which task failed, and what it means for the run.
- ``logs``: exact running logs of scheduled calls, computed only when read.
- ``watchdog``: the workers' update counts and rates, and stuck workers.
"""
