"""tfdist: one Keras 3 training loop for every tf.distribute strategy.

    import tfdist
    strategy = tfdist.make_strategy("mirrored", num_devices=2)
    trainer = tfdist.Trainer(lambda: tfdist.models.get("cnn"), strategy=strategy, loss=..., metrics=["accuracy"])
    trainer.fit(tfdist.data.load("digits"), epochs=5, global_batch_size=128)
"""
from tfdist import _compat

_compat.apply()

from tfdist import callbacks, data, launch, models  # noqa: E402
from tfdist.strategies.factory import make_strategy  # noqa: E402
from tfdist.training.trainer import Trainer  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Trainer", "make_strategy", "callbacks", "data", "launch", "models", "__version__"]
