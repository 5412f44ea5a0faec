"""``tfdist bench --benchmarks=language_model``: a small GPT on the standard library's source,
tokens/s of plain Keras and of each way the Trainer trains it, and time to a target bits per
byte on 1 and 2 workers.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches one process and then two workers, reports the ratios.
* ``worker.py``: what each launched process runs (kind ``language_model``): its sides, timed
  alternately, then a run to the target.
"""
