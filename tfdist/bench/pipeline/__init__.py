"""``tfdist bench --benchmarks=pipeline``: pipeline stages on two devices against one device doing
the same work.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: starts its three processes itself (not ``tfdist launch``), reports.
* ``worker.py``: what each process runs (``python -m``): JSON commands on stdin.
* ``trace.py``: the bubble: GPipe's formula and the one a profiler trace measures.
"""
