"""Ray and MLflow wiring for dynlm. Thin: the work happens in the ``dynlm`` library."""
