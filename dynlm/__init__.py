"""dynlm: dynamic language models in pure PyTorch.

The library (this package) holds data readers, preprocessing, models and the training
step. It never imports Ray or MLflow: ``pipelines/`` wires it to them.
"""

__version__ = "0.1.0"
