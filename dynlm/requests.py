"""What every served model shares: its request as a table, and the error a bad request raises.

A task's ``serve`` (:meth:`dynlm.tasks.base.Task.serve`) reads its request through
:func:`request_frame` and raises :class:`InputError` with a one-line reason, which the served
model answers as HTTP 400 (``pipelines/pyfunc_model.py``).
"""

from __future__ import annotations

import math
from typing import Any


class InputError(ValueError):
    """Bad input documents (an empty document, a wrong column); the message says which document."""


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def request_frame(request: Any, *, columns: tuple[str, ...], required_any: tuple[str, ...], hint: str,
                  rows_are: str = "rows"):
    """A served model's request as a pandas DataFrame, checked for its columns.

    ``request`` is a DataFrame, a dict of columns, a list of row dicts, a list of strings (one row
    each, in column ``required_any[0]``) or one string (one such row).

    Raises:
        InputError: another type, a column not in ``columns``, none of ``required_any`` (the
            message adds ``hint``), or no rows (``no <rows_are>``).
    """
    import pandas as pd  # lazy: only the pyfunc input needs it

    first = required_any[0]
    if isinstance(request, str):
        request = pd.DataFrame({first: [request]})
    elif isinstance(request, dict):
        request = pd.DataFrame(request)
    elif isinstance(request, list):
        request = pd.DataFrame({first: request}) if all(isinstance(x, str) for x in request) else pd.DataFrame(request)
    needed = " or ".join(repr(c) for c in required_any)
    if not isinstance(request, pd.DataFrame):
        raise InputError(f"expected a DataFrame with a {needed} column, got {type(request).__name__}")
    unknown = sorted(set(request.columns) - set(columns))
    if unknown:
        raise InputError(f"unknown input column(s) {unknown}: use {' or '.join(repr(c) for c in columns)}")
    if not set(required_any) & set(request.columns):
        raise InputError(f"the input has no {needed} column: {hint}")
    if len(request) == 0:
        raise InputError(f"no {rows_are}: the input has no rows")
    return request
