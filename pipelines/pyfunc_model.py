"""The MLflow pyfunc of a dynlm model, logged as *models from code* (no pickled objects).

MLflow stores this file with the model and runs it to load the model; it calls
``mlflow.models.set_model(DynLMPyfunc())`` at the end. The artifacts (``weights.pt``,
``model.json``, ``preprocessor.json``) are ``dynlm/serving.py``'s, the input parsing and the
answer the model's task's; this file adds the MLflow side: the signature, the input example, and
bad input as an ``MlflowException`` (HTTP 400 from ``mlflow models serve``).

What a request holds and what the answer is are the task's (``Task.serving_inputs`` /
``serving_outputs`` / ``serve``, the signature built from them here). The LM task: one document
per row, column ``text`` (raw text, one sentence per line) or ``tokens`` (a list of sentences,
each a list of strings) -> ``tokens``, ``token_log_probs``, ``num_tokens``, ``num_unknown``,
``log_prob``, ``perplexity`` (:func:`dynlm.tasks.lm_serving.score_documents`). The naming task: column
``source`` (Python source text) -> one row per function with its suggested names.

This file imports only pandas, mlflow and dynlm (bundled with the model as code), never
``pipelines``, so a served model does not need this repository's pipeline code.
"""

# No ``from __future__ import annotations``: MLflow reads ``predict``'s type hints as objects
# (``pd.DataFrame`` in and out: no schema inferred from them, the signature below is the schema).
import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.types import DataType
from mlflow.types.schema import Array, ColSpec, Schema

from dynlm import serving
from dynlm.requests import InputError

# Task.serving_inputs / serving_outputs column types (dynlm.tasks.base.SERVING_TYPES) -> MLflow's.
COLUMN_TYPES = {
    "string": DataType.string, "long": DataType.long, "double": DataType.double,
    "list<string>": Array(DataType.string), "list<double>": Array(DataType.double),
    "list<list<string>>": Array(Array(DataType.string)),
}


def signature_for(task) -> ModelSignature | None:
    """The model signature of ``task``'s served model (None: the task answers no requests)."""
    if not task.serving_inputs:
        return None
    return ModelSignature(
        inputs=Schema([ColSpec(COLUMN_TYPES[kind], name, required=False) for name, kind in task.serving_inputs]),
        outputs=Schema([ColSpec(COLUMN_TYPES[kind], name) for name, kind in task.serving_outputs]))


def input_example_for(task) -> pd.DataFrame | None:
    """``task``'s example request as a DataFrame (None: none)."""
    return pd.DataFrame(task.serving_example) if task.serving_example else None


class InvalidInput(MlflowException):
    """Bad pyfunc input (an empty document, a wrong column); the message says which document."""

    def __init__(self, message: str):
        super().__init__(message, error_code=INVALID_PARAMETER_VALUE)


class DynLMPyfunc(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper: a request -> the model's task's answer (``Task.serve``)."""

    def load_context(self, context) -> None:
        paths = {key: context.artifacts[key] for key in serving.ARTIFACT_KEYS}
        self.task, self.model, self.model_cfg, self.spec, self.preprocessor = serving.load_artifacts(
            paths["weights"], paths["model_config"], paths["preprocessor"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        try:  # bad input is a 400 with its one-line reason (an InputError), never a traceback
            rows = self.task.serve(self.model, self.model_cfg, self.spec, self.preprocessor, model_input)
        except InputError as exc:
            raise InvalidInput(str(exc)) from None
        return pd.DataFrame(rows, columns=[name for name, _ in self.task.serving_outputs])


mlflow.models.set_model(DynLMPyfunc())
