"""``python -m tfdist`` is the ``tfdist`` command."""

from tfdist.cli import run

if __name__ == "__main__":
    run()
