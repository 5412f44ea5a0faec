"""When things happen in one ``fit``, ``evaluate`` or ``predict`` call.

Start at ``run`` (one ``Trainer.fit`` wired in order), then ``train_loop`` (all its epochs) and
``one_epoch`` (one epoch's calls).

- ``run``: one ``Trainer.fit``: data, compiled functions, backups, then the epochs.
- ``arguments``: the checks of ``fit``'s loop arguments, and its ``steps_per_execution``.
- ``keras_data``: Keras's data arguments (``x``, ``y``, ``sample_weight``, ...) as one input.
- ``sources``: ``fit``/``evaluate``/``predict``'s data arguments as checked input sources.
- ``train_loop``: ``on_train_begin`` to ``on_train_end``: an iterator per epoch, SIGTERM watched.
- ``one_epoch``: ``EpochLoop``: one epoch's calls, callbacks, step backups.
- ``preemption``: SIGTERM noted, so that every worker stops at the same step boundary.
- ``chief_only``: Keras callbacks in a multi-worker run: only the chief writes for real.
- ``callback_mapping``: which Keras callbacks run as they are, map onto options, or are refused.
- ``inference``: ``Trainer.evaluate`` and ``Trainer.predict`` with Keras's arguments.
- ``evaluation``: evaluation and prediction: each example counts once, outputs in input order.
"""
