"""What one update computes, written once and shared by every runner.

Start at ``update`` (``TrainUpdate``: the replica step, its micro-batches and its state).

- ``update``: the replica training step: forward, loss, scaling, accumulation, the update.
- ``objective``: a micro-batch's loss normalised by the global batch, its tracker and metrics.
- ``gradients``: gradient helpers: sums of dense and sparse gradients, partitioned variables.
- ``exchange``: the all-reduce of gradients: buckets, 16-bit compression, sparse rows gathered.
- ``masked_losses``: Keras's loss of one replica's batch, masked terms over the global valid count.
- ``inference``: the replica steps of evaluation and prediction.
- ``model_steps``: a model's own ``train_step`` / ``test_step`` / ``predict_step`` as the step.
"""
