"""The champion/challenger promotion policy of dynlm, without the registry it is applied to.

``pipelines/tracking.py: register_and_promote`` registers every trained model as a version of
:func:`registered_name` and asks :func:`decide_registration` whether the alias ``champion``
moves to it; :func:`promotion_decision` is the policy itself (a relative margin, on the same
validation set, identified by :func:`valid_data_hash`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynlm.config import config_hash
from dynlm.data.fingerprint import input_listing
from dynlm.data.prepared import PreparedData

MODEL_NAME_PREFIX = "dynlm-"


def registered_name(model_type: str) -> str:
    """The registered model of a model type: ``dynlm-<model_type>``."""
    return f"{MODEL_NAME_PREFIX}{model_type}"


@dataclass
class RegistrationResult:
    """What ``register_and_promote`` did.

    Attributes:
        name: registered model name, ``dynlm-<model_type>``.
        version: the new version (alias ``challenger``).
        decision: ``promoted`` (``champion`` now points at ``version``), ``rejected`` (it did
            not win), ``conflict`` (a caller-measured champion was no longer the champion).
        reason: one sentence saying why (also stored as the version tag ``promotion``).
        champion_version: the version ``champion`` points at after the call (None: none).
    """

    name: str
    version: str
    decision: str  # "promoted" | "rejected" | "conflict" (the champion moved; see register_and_promote)
    reason: str
    champion_version: str | None

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"


@dataclass(frozen=True)
class MeasuredChampion:
    """The champion as scored by the caller on the challenger's validation set (retraining
    scores both models on one fixed set): its version and perplexity there."""

    version: str
    ppl: float


def valid_data_hash(prepared: PreparedData) -> str:
    """Identity of the validation set of ``prepared``: the content of its ``valid`` shards.

    Stored as the run and version tag ``valid_data_hash``; ``register_and_promote`` compares
    perplexities only between versions with the same value. Two folders with byte-identical
    valid shards (same documents, same encoding) give the same value, wherever they live.
    """
    return config_hash({"valid_shards": input_listing([str(f) for f in prepared.files("valid")])})


def promotion_decision(valid_ppl: float, valid_hash: str, champion_ppl: float | None,
                       champion_hash: str | None, margin: float, *, metric: str = "ppl") -> tuple[bool, str]:
    """THE promotion policy of dynlm: whether a challenger replaces the champion, and why.

    Promote iff there is no champion yet, or both were scored on the same validation set
    (``valid_hash == champion_hash``) and ``valid_ppl < champion_ppl * (1 - margin)``.

    The margin is RELATIVE: perplexity is ``exp(cross entropy)``, so a fixed fraction of it is a
    fixed difference in loss (``margin=0.01`` asks for ~0.01 nats per token) whatever the scale;
    an absolute margin of 1 point would be noise at perplexity 300 and a big step at 20.

    Args:
        valid_ppl: the challenger's validation perplexity.
        valid_hash: identity of the validation set it was measured on (``valid_data_hash``).
        champion_ppl: the champion's perplexity (None: there is no champion).
        champion_hash: the validation set the champion's perplexity was measured on.
        margin: in ``[0, 1)``; 0 means "strictly better".
        metric: the task's primary metric the two numbers are (lower is better; named in the
            reason). The names ``valid_ppl`` / ``champion_ppl`` are the LM task's; any task's
            objective goes through the same rule.

    Returns:
        ``(promote, reason)``; the reason is one sentence without the verdict prefix.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"promotion margin must be in [0, 1) (a fraction of the champion's perplexity), "
                         f"got {margin}")
    if not math.isfinite(valid_ppl):
        return False, f"valid_{metric} {valid_ppl} is not finite"
    if champion_ppl is None:
        return True, "there was no champion yet"
    if champion_hash != valid_hash:
        return False, (f"the champion was validated on {champion_hash}, the challenger on {valid_hash}; "
                       f"{metric} values on different validation sets are not comparable (evaluate both "
                       "on one dataset and set the alias by hand)")
    threshold = champion_ppl * (1.0 - margin)
    verb = "beats" if valid_ppl < threshold else "does not beat"
    return valid_ppl < threshold, (f"valid_{metric} {valid_ppl:.4f} {verb} champion {metric} {champion_ppl:.4f} "
                                   f"x (1 - margin {margin:g}) = {threshold:.4f} on validation {valid_hash}")


def decide_registration(version: str, valid_ppl: float, valid_hash: str, margin: float, *,
                        current_version: str | None, current_ppl: float | None, current_hash: str | None,
                        champion: MeasuredChampion | None = None, metric: str = "ppl") -> tuple[str, str]:
    """What happens to the new ``version`` against the registry's current champion.

    Args:
        version: the new version (already ``challenger``).
        valid_ppl, valid_hash, margin: as for :func:`promotion_decision`.
        current_version: the version ``champion`` points at now (None: no champion).
        current_ppl, current_hash: that version's tags ``valid_ppl`` / ``valid_data_hash``
            (used when ``champion`` is None).
        champion: the champion as measured by the caller; when ``champion`` no longer points at
            its version (another caller promoted meanwhile) the decision is ``conflict``.
        metric: the task's primary metric (see :func:`promotion_decision`).

    Returns:
        ``(decision, reason)``: ``promoted`` | ``rejected`` | ``conflict``, and the sentence
        stored as the version tag ``promotion``.
    """
    if champion is not None and current_version != champion.version:
        return "conflict", (f"refused: champion moved from v{champion.version} to "
                            f"v{current_version} while v{version} was being trained and scored")
    if champion is not None:
        champion_ppl, champion_hash = champion.ppl, valid_hash
    elif current_version is not None:
        champion_ppl, champion_hash = current_ppl, current_hash
    else:
        champion_ppl = champion_hash = None
    promote, why = promotion_decision(valid_ppl, valid_hash, champion_ppl, champion_hash, margin, metric=metric)
    against = f" (v{version} vs champion v{current_version})" if current_version is not None else ""
    return ("promoted", f"promoted: {why}{against}") if promote else ("rejected", f"not promoted: {why}{against}")
