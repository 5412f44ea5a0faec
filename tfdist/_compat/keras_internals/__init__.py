"""Keras's private names that tfdist uses, each behind one named function.

- ``keras_training``: the Keras and TF internals of tfdist's training code.
- ``fit_hooks``: what tfdist's callbacks need of ``fit`` and of the progress bar.
- ``masks``: the ``_keras_mask`` a tensor carries, and the masked terms of Keras's losses.
- ``metric_state``: metric state as local tensors, for exact parameter-server logs.
- ``optimizer``: ``gradients_already_summed``: a Keras optimizer that does not all-reduce;
  ``apply_in_cross_replica_context``: one that applies from cross-replica context.
- ``atomic``: shim ``atomic_assign_add``: Keras variable increments as one atomic TF op.
- ``thread_losses``: shim ``thread_losses``: each thread's ``add_loss`` terms in a list of its own.
- ``scope_moves``: the user's live Keras objects moved into a strategy scope.
- ``layer_graph``: a functional model's calls in order, nested models flattened.
- ``unit_calls``: a functional model called one layer at a time (nested ones through); the
  units' losses read as given.
- ``storage``: a Keras variable's TF storage held apart and given back; a TF variable's buffer
  emptied and refilled in place (ZeRO-3's blocks between fits).
- ``py_dataset``: Keras's own parallel reader of a ``PyDataset`` (``OrderedEnqueuer``).
- ``multi_worker_fit``: shims that make plain ``model.fit`` work on MultiWorkerMirrored workers.
"""
