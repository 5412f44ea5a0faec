"""``tfdist bench --benchmarks=stragglers``: one slowed worker, MWMS and parameter-server training
side by side.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches MWMS, then PS; balanced and straggler sides alternate.
* ``worker.py``: what each launched task runs: the Trainer; worker 1 sleeps before its batches.
"""
