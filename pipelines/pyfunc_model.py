"""The MLflow pyfunc of a dynlm model, logged as *models from code* (no pickled objects).

MLflow stores this file with the model and runs it to load the model; it calls
``mlflow.models.set_model(DynLMPyfunc())`` at the end. The artifacts (``weights.pt``,
``model.json``, ``preprocessor.json``), the input parsing and the scoring are
``dynlm/serving.py``'s; this file adds the MLflow side: the signature, the input example, and
bad input as an ``MlflowException`` (HTTP 400 from ``mlflow models serve``).

Input: a DataFrame with one document per row, either column ``text`` (raw text, one sentence
per line) or column ``tokens`` (a list of sentences, each a list of strings). Output: one row
per document: ``tokens``, ``token_log_probs``, ``num_tokens``, ``num_unknown``, ``log_prob``,
``perplexity`` (see :func:`dynlm.serving.score_documents`).

This file imports only pandas, mlflow and dynlm (bundled with the model as code), never
``pipelines``, so a served model does not need this repository's pipeline code.
"""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import DataType
from mlflow.types.schema import Array, ColSpec, Schema

from dynlm import serving

SIGNATURE = ModelSignature(
    inputs=Schema([
        ColSpec(DataType.string, "text", required=False),
        ColSpec(Array(Array(DataType.string)), "tokens", required=False),
    ]),
    outputs=Schema([
        ColSpec(Array(DataType.string), "tokens"),
        ColSpec(Array(DataType.double), "token_log_probs"),
        ColSpec(DataType.long, "num_tokens"),
        ColSpec(DataType.long, "num_unknown"),
        ColSpec(DataType.double, "log_prob"),
        ColSpec(DataType.double, "perplexity"),
    ]),
)
INPUT_EXAMPLE = pd.DataFrame({"text": ["The old captain walked into the harbour town .\n"
                                       "He looked at the ships ."]})


class InvalidInput(MlflowException):
    """Bad pyfunc input (an empty document, a wrong column); the message says which document."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


class DynLMPyfunc(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: raw text or token lists -> per-token log-probs and perplexity."""

    def load_context(self, context) -> None:
        paths = {key: context.artifacts[key] for key in serving.ARTIFACT_KEYS}
        self.task, self.model, self.model_cfg, self.spec, self.preprocessor = serving.load_artifacts(
            paths["weights"], paths["model_config"], paths["preprocessor"])

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        if self.task.name != "lm":  # loaded and evaluated like any model; scoring documents is the LM's
            raise InvalidInput(f"a {self.task.name!r} task model scores no documents here; evaluate it "
                               "with `dynlm evaluate --model <its models:/ URI>`")
        try:  # bad input is a 400 with its one-line reason (an InputError), never a traceback
            documents = serving.parse_input(model_input)
            scores = serving.score_documents(self.model, self.model_cfg, self.spec, self.preprocessor,
                                             documents)
        except serving.InputError as exc:
            raise InvalidInput(str(exc)) from None
        return pd.DataFrame(scores)


mlflow.models.set_model(DynLMPyfunc())
