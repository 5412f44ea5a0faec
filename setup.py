"""tfdist: tf.distribute strategies for Keras 3 behind one training loop.

Install for development with ``pip install -e .[test]`` (Ray included); Ray alone with ``pip install tfdist[ray]``.
"""
from setuptools import find_packages, setup

setup(
    name="tfdist",
    version="0.1.0",
    description="One Keras 3 training loop for the OneDevice, Mirrored, MultiWorkerMirrored and ParameterServer strategies.",
    packages=find_packages(include=["tfdist", "tfdist.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow==2.21.*",
        "keras>=3.15,<4",
        "tensorflow-datasets>=4.9",
        "absl-py>=2.0",
        "tensorboard>=2.20",
        "scikit-learn>=1.3",
        "portpicker>=1.6",
        "pyyaml>=6",  # tfdist manifest kubernetes writes its YAML with PyYAML.
        "numpy",
    ],
    extras_require={
        "ray": ["ray[train]>=2.60,<3"],
        "test": ["ray[train]>=2.60,<3",
                 # KerasHub's GPT-2, BERT and Llama, built from their constructors (no download).
                 "keras-hub>=0.32,<1", "tensorflow-text==2.21.*", "ruff>=0.6", "pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "pyyaml>=6", "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6", "matplotlib>=3.8",
                 # The documentation site (tests/test_docs.py builds it with mkdocs build --strict).
                 "mkdocs>=1.6.1,<2", "mkdocstrings[python]>=1.0.8,<2", "mkdocstrings-python>=2.0.11,<3"],
        "notebooks": ["jupyter", "nbclient>=0.10", "nbformat>=5.9", "ipykernel>=6", "matplotlib>=3.8"],
        "gpu": ["tensorflow[and-cuda]==2.21.*"],
    },
    entry_points={"console_scripts": ["tfdist=tfdist.cli:run"]},
)
