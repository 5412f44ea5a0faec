"""What every benchmark shares: the registry of functions, the timing, the fits, the reports, and
the running of worker processes. Start at ``common.py`` (how a benchmark registers), then
``timing.py`` (how two sides are measured on a noisy machine).

* ``common.py``: ``@register``, the benchmarks' options and the shared in-process strategies.
* ``timing.py``: stopwatches that see other processes' CPU, alternation, clean medians (no TF).
* ``fits.py``: ``Trainer.fit`` against Keras ``model.fit``: the two sides, their data and timing.
* ``report.py``: the summary table, the JSON file and the PNG chart of the ratios.
* ``plots.py``: the PNG figures of the multi-process benchmarks.
* ``cluster_run.py``: runs a benchmark's tasks in real processes through ``tfdist launch``.
* ``workers.py``: the program every launched task runs (``python -m``), dispatching by kind.
* ``worker_common.py``: what every launched task shares: who it is, its threads, its records.
"""
