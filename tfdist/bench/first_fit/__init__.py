"""``tfdist bench --benchmarks=first_fit``: first fits on a fresh cluster; the Trainer against a raw
loop; as users launch.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches fresh clusters, reports first against steady fits.
* ``worker.py``: what each launched worker runs: a first fit and steady ones, timed.
"""
