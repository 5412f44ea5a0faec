"""The benchmarks that run in the ``tfdist bench`` process itself (run by default), each one module
registering one benchmark of the same name (``ps_hand_written.py`` excepted). Start at
``trainer_vs_fit.py``, the simplest: ``harness.fits`` sides, alternated.

* ``trainer_vs_fit.py``: examples/s of ``tfdist.Trainer.fit`` against Keras ``model.fit``.
* ``mfu.py``: model FLOP utilisation of float32 training, Trainer and Keras fit.
* ``accumulation.py``: the Trainer with gradient accumulation against without.
* ``bf16_vs_fp32.py``: step time in ``mixed_bfloat16`` against ``float32``; the CPU's features.
* ``backup.py``: what step-exact backups cost, asynchronous and synchronous.
* ``parameter_server.py``: the Trainer on ParameterServerStrategy against hand-written loops.
* ``ps_hand_written.py``: the hand-written coordinator loops of ``parameter_server``.
* ``sparse_exchange.py``: the bytes an embedding's gradient sends as rows or dense, and speed.
"""
