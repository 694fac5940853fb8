"""One module per ``dynlm`` verb; each exposes ``register(subparsers)``.

Modules import Ray and MLflow inside their ``run`` functions, so ``dynlm --help`` stays fast.
"""
