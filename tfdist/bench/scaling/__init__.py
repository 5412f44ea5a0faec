"""``tfdist bench --benchmarks=scaling``: weak scaling over real worker processes, side by side,
each step split into parts.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches 1, 2, 4... workers, reads their records, reports.
* ``worker.py``: what each launched worker runs (kinds ``scaling`` and ``scaling_ps``).
* ``sides.py``: the sides a worker times, the parts of a step; other benchmarks' workers reuse it.
"""
