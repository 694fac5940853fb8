"""Dynamic evaluation (Krause et al., 2018), RMS variant with a global prior, for any static LM.

While a test document is read in segments of ``segment_len`` tokens, the model keeps adapting
to it: each segment is scored first (that score is what the metrics count), then the weights
take one step on that segment's mean NLL::

    theta <- theta - lr * grad / (rms + eps) + decay * decay_rate * (theta_0 - theta)

``rms`` is the root-mean-square gradient of each weight collected on training data, read
exactly as the test documents are (one document at a time, the same segments:
:func:`collect_grad_stats`), ``decay_rate = rms / mean(rms)`` (over all weights, clipped at
``1 / decay``) pulls often-changing weights back faster towards the trained ``theta_0``.

Documents are independent articles: theta is reset to theta_0 (and the recurrent state to
zero) at the start of every document. Each document of a batch is therefore read on its own
(batch size 1, in order); the metrics are those of :func:`dynlm.training.evaluate`.

With ``lr = decay = 0`` dynamic evaluation IS static evaluation, per metric category (tested for
every model type). Two kinds of model need care for that:

* a model that reads a sentence as a whole (``needs_whole_sentences = True``: the DNTM, whose
  entity memory merges a sentence's mentions after the sentence, with a bidirectional context
  encoder over all of it) gets whole sentences: a segment is the sentences read until it holds
  at least ``segment_len`` tokens, the update comes after the sentence that completes it. Cut
  inside a sentence, the DNTM would merge the first part's mentions before the rest of the
  sentence is read, from contexts that see only the part (issue 18: another model);
* a model that detaches its outputs in eval mode (``graph_at_eval``: the dynamical LM) is asked
  to keep the graph to its weights while dynamic evaluation reads (else there is no gradient).

Other models (the RNN LM) are cut at exactly ``segment_len`` tokens, across sentence ends.

Which weights adapt: every trainable one by default, except those a model declares static for
dynamic evaluation (``dynamic_eval_static_params``). The DNTM declares every weight outside its
LM (``lm.*``) static: a step on W_dy (each entity's dynamic score is ``h . W_dy d_e``) moves every
entity score at once, hurt re-appearing entities and diverged at eta = 1e-2, and steps on the
memory side (W_dx, context encoder, merge) change every chain's dynamic embedding at once and cost
re-appearing entities too (issue 18). ``names=`` chooses explicitly.

``eta`` and ``lambda`` matter a lot and depend on the model: :func:`choose_dynamic_eval` picks
them on validation data from a small grid (``DEFAULT_ETAS`` x ``DEFAULT_LAMBDAS``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import torch
from torch import nn

from dynlm.config import Config, ConfigError
from dynlm.losses import token_nll
from dynlm.metrics import MetricAccumulator
from dynlm.modules.fast_weights import select_rows, slice_columns
from dynlm.modules.meta_learner import UpdatePrior

DEFAULT_ETAS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)  # the grid of choose_dynamic_eval
DEFAULT_LAMBDAS = (0.0, 0.01)


@dataclass
class DynamicEvalConfig(Config):
    """Hyper-parameters of dynamic evaluation.

    Attributes:
        lr: eta, the step size (applied to grad / (rms + eps)).
        decay: lambda, the strength of the pull back to the trained weights.
        eps: added to the RMS gradient statistics.
        segment_len: tokens per segment (one update per segment).
    """

    lr: float = 2e-5
    decay: float = 0.02
    eps: float = 1e-3
    segment_len: int = 20

    def validate(self) -> None:
        if self.lr < 0 or self.decay < 0 or self.eps <= 0:
            raise ConfigError(f"dynamic eval: need lr >= 0, decay >= 0, eps > 0 (got {self.lr}, {self.decay}, {self.eps})")
        if self.segment_len <= 0:
            raise ConfigError(f"dynamic eval: segment_len must be positive, got {self.segment_len}")


def _trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def default_adapted_names(model: nn.Module) -> list[str]:
    """The weights dynamic evaluation adapts when not told: every trainable one except those the
    model declares static for it (``dynamic_eval_static_params``: the DNTM's weights outside ``lm.*``)."""
    static = set(getattr(model, "dynamic_eval_static_params", ()))
    return [name for name in _trainable(model) if name not in static]


def _adapted_parameters(model: nn.Module, names: Sequence[str] | None,
                        stats: dict[str, torch.Tensor]) -> dict[str, nn.Parameter]:
    """The trainable parameters named in ``names`` (:func:`default_adapted_names` when None),
    each with statistics."""
    params = _trainable(model)
    names = default_adapted_names(model) if names is None else names
    unknown = sorted(set(names) - set(params))
    if unknown:
        raise ValueError(f"dynamic_evaluate: {unknown} are not trainable parameters of the model")
    params = {name: params[name] for name in names}
    missing = sorted(set(params) - set(stats))
    if missing:
        raise ValueError(f"dynamic_evaluate: no gradient statistics for {missing[:3]} "
                         f"({len(missing)} parameters); run collect_grad_stats on this model")
    return params


def rms_priors(rms: dict[str, torch.Tensor], eps: float, decay: float) -> dict[str, UpdatePrior]:
    """Per-weight ``denominator = rms + eps`` and ``decay_rate = rms / mean(rms)``.

    The mean is over every coordinate of every tensor in ``rms`` (the adapted weights), and the
    rate is clipped at ``1 / decay`` so that no coordinate is pulled past theta_0.

    Args:
        rms: name -> ``[*shape]`` RMS gradient statistics (:func:`collect_grad_stats`).
        eps: added to the statistics.
        decay: lambda (only for the clip; 0: no clip).

    Returns:
        name -> :class:`~dynlm.modules.meta_learner.UpdatePrior` of the tensor's shape.
    """
    mean_rms = torch.cat([r.flatten() for r in rms.values()]).mean().clamp_min(1e-12)
    max_rate = 1.0 / decay if decay > 0 else float("inf")
    return {name: UpdatePrior(denominator=r + eps, decay_rate=(r / mean_rms).clamp(max=max_rate))
            for name, r in rms.items()}


def _reads_whole_sentences(model: nn.Module) -> bool:
    """The model must get whole sentences per forward call (``needs_whole_sentences``: the DNTM)."""
    return bool(getattr(model, "needs_whole_sentences", False))


def _piece_end(whole_sentences: bool, pos: int, length: int, seg_pos: int, segment_len: int) -> int:
    """Where the next forward call stops in a sentence of ``length`` positions read from ``pos``.

    A whole-sentence model reads to the sentence's end; another model stops at the end of the
    current segment (``segment_len - seg_pos`` positions on) when that comes first.
    """
    if whole_sentences:
        return length
    return min(pos + segment_len - seg_pos, length)


@contextmanager
def _outputs_with_graph(model: nn.Module) -> Iterator[None]:
    """Ask a model that detaches its eval outputs (``graph_at_eval``) to keep their graph meanwhile."""
    if not hasattr(model, "graph_at_eval"):
        yield
        return
    before = model.graph_at_eval
    model.graph_at_eval = True
    try:
        yield
    finally:
        model.graph_at_eval = before


class _Piece(NamedTuple):
    """One forward call of a document read alone: ``batch`` (1 document), the indices of its
    document (reading order) and segment, and whether it completes that segment."""

    document: int
    segment: int
    batch: Any
    closes_segment: bool


def _document_pieces(model: nn.Module, batches: Iterable, segment_len: int, device) -> Iterator[_Piece]:
    """Every document of ``batches`` on its own, in order, cut into the forward calls of segments.

    A segment is ``segment_len`` positions (across sentence ends), or for a whole-sentence model
    the sentences read until it holds at least ``segment_len`` tokens; a document's last
    segment may stay incomplete (no piece closes it).
    """
    whole = _reads_whole_sentences(model)
    document = 0
    for doc_batch in batches:
        for row in range(doc_batch.batch_size):
            seg_pos, segment = 0, 0
            for sentence in doc_batch.sentences:
                length = int(sentence.lengths[row])
                if length == 0:
                    continue
                doc_sentence = slice_columns(select_rows(sentence, [row]), 0, length).to(device)
                pos = 0
                while pos < length:
                    end = _piece_end(whole, pos, length, seg_pos, segment_len)
                    seg_pos += end - pos
                    closes = seg_pos >= segment_len
                    yield _Piece(document, segment, slice_columns(doc_sentence, pos, end), closes)
                    pos = end
                    if closes:
                        seg_pos, segment = 0, segment + 1
            document += 1


@torch.backends.cudnn.flags(enabled=False)  # cuDNN RNN backward refuses eval mode
def collect_grad_stats(model: nn.Module, batches: Iterable, *, segment_len: int = 20,
                       max_segments: int | None = None) -> dict[str, torch.Tensor]:
    """RMS of each weight's gradient over segments of training data (model in eval mode).

    The documents are read exactly as :func:`dynamic_scores` reads test documents: each on its
    own, in the same segments; the gradient of each complete segment's mean NLL is squared and
    averaged over segments. The statistics thus have the scale of the gradients the update
    divides by them (issue 18: averaged over a batch of 8 documents, as before, they were ~2x
    too small, so every step was ~2x what eta says; the DNTM's shared W_dy diverged). The
    recurrent state flows through the document but is detached between segments.

    Args:
        model: a static LM (stateful interface of :mod:`dynlm.models`).
        batches: ``DocumentBatch`` objects of training data.
        segment_len: segment length in tokens.
        max_segments: stop after this many segments (None: read every batch).

    Returns:
        name -> ``sqrt(mean(grad ** 2))`` with the parameter's shape (``named_parameters`` names).
    """
    params = _trainable(model)
    sums = {name: torch.zeros_like(p) for name, p in params.items()}
    count = 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.enable_grad(), _outputs_with_graph(model):
            current, state, seg_nll, seg_tokens = None, None, None, 0
            for item in _document_pieces(model, batches, segment_len, device):
                if item.document != current:
                    current, state, seg_nll, seg_tokens = item.document, model.init_state(1, device), None, 0
                output, state = model(item.batch, state)
                nll = token_nll(output.logits, item.batch.targets, item.batch.mask, output.positions).sum()
                seg_nll = nll if seg_nll is None else seg_nll + nll
                seg_tokens += int(item.batch.mask.sum())
                if not item.closes_segment:
                    continue
                grads = torch.autograd.grad(seg_nll / seg_tokens, list(params.values()), allow_unused=True)
                for name, g in zip(params, grads):
                    if g is not None:
                        sums[name] += g.detach() ** 2
                count += 1
                state, seg_nll, seg_tokens = model.detach_state(state), None, 0
                if max_segments is not None and count >= max_segments:
                    break
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError(f"collect_grad_stats: no document holds a segment of {segment_len} tokens")
    return {name: (s / count).sqrt() for name, s in sums.items()}


class DynamicScore(NamedTuple):
    """The scores of one forward call of dynamic evaluation (see :func:`dynamic_scores`).

    Attributes:
        document: index of the document in reading order (over all batches, 0-based).
        segment: index of the segment in its document; segment 0 is read with theta_0.
        nll: ``[1, l]`` token NLL (nats), scored before the update that uses it.
        piece: the ``SentenceBatch`` read (one document, ``l`` positions: targets, mask,
            ``target_kind``), for :meth:`dynlm.metrics.MetricAccumulator.update_from_nll`.
    """

    document: int
    segment: int
    nll: torch.Tensor
    piece: Any


def dynamic_scores(model: nn.Module, batches: Iterable, cfg: DynamicEvalConfig,
                   stats: dict[str, torch.Tensor], *, names: Sequence[str] | None = None) -> Iterator[DynamicScore]:
    """Read ``batches`` with dynamic evaluation, yielding the scores of every forward call.

    Each document is read on its own from theta_0 and a fresh state. A segment is
    ``cfg.segment_len`` positions (across sentence ends), or for a whole-sentence model the
    sentences read until it holds at least ``cfg.segment_len`` tokens; after each complete
    segment the adapted weights take one step on its mean NLL and the state is detached.

    The model is in eval mode while the generator runs; its weights and mode are restored when
    it ends or is closed (and cuDNN is off meanwhile: its RNN backward refuses eval mode).

    Args: as :func:`dynamic_evaluate`.

    Yields:
        :class:`DynamicScore` in reading order.
    """
    params = _adapted_parameters(model, names, stats)
    theta0 = {name: p.detach().clone() for name, p in params.items()}
    priors = rms_priors({name: stats[name].to(p.device, p.dtype) for name, p in params.items()},
                        cfg.eps, cfg.decay)
    names = list(params)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()

    def restore() -> None:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(theta0[name])

    def step(segment_loss: torch.Tensor) -> None:
        grads = torch.autograd.grad(segment_loss, [params[n] for n in names], allow_unused=True)
        with torch.no_grad():
            for name, g in zip(names, grads):
                p, prior = params[name], priors[name]
                pull = (cfg.decay * prior.decay_rate) * (theta0[name] - p)  # from theta before the step
                if g is not None:
                    p.sub_(cfg.lr * (g / prior.denominator))
                p.add_(pull)

    try:
        with torch.backends.cudnn.flags(enabled=False), torch.enable_grad(), _outputs_with_graph(model):
            current, state, seg_loss, seg_tokens = None, None, None, 0
            for item in _document_pieces(model, batches, cfg.segment_len, device):
                if item.document != current:
                    restore()  # theta = theta_0 at each document start
                    current, state, seg_loss, seg_tokens = item.document, model.init_state(1, device), None, 0
                output, state = model(item.batch, state)
                nll = token_nll(output.logits, item.batch.targets, item.batch.mask, output.positions)  # [1, l]
                yield DynamicScore(item.document, item.segment, nll.detach(), item.batch)
                seg_loss = nll.sum() if seg_loss is None else seg_loss + nll.sum()
                seg_tokens += item.batch.tokens.size(1)
                if item.closes_segment:
                    step(seg_loss / seg_tokens)
                    state, seg_loss, seg_tokens = model.detach_state(state), None, 0
    finally:
        restore()
        model.train(was_training)


def dynamic_evaluate(model: nn.Module, batches: Iterable, cfg: DynamicEvalConfig,
                     stats: dict[str, torch.Tensor], *, names: Sequence[str] | None = None) -> dict[str, float]:
    """Evaluate ``model`` with dynamic evaluation; the model's weights are restored afterwards.

    Args:
        model: a trained static LM (stateful interface of :mod:`dynlm.models`).
        batches: ``DocumentBatch`` objects (whole documents; each is read on its own).
        cfg: step size, decay, eps and segment length.
        stats: :func:`collect_grad_stats` output for this model.
        names: the parameters that adapt (``named_parameters`` names; default:
            :func:`default_adapted_names`, every trainable one but those the model declares
            static); the others stay static. E.g. ``["decoder.weight", "decoder.bias"]``.

    Returns:
        The metrics of :func:`dynlm.training.evaluate` (``loss``, ``ppl``, ``ppl_*``, ``tokens`` ...),
        every token scored before the update that uses it (:func:`dynamic_scores`).
    """
    metrics = MetricAccumulator()
    for score in dynamic_scores(model, batches, cfg, stats, names=names):
        metrics.update_from_nll(score.nll, score.piece)
    return metrics.compute()


def choose_dynamic_eval(model: nn.Module, valid_batches: Sequence, stats: dict[str, torch.Tensor], *,
                        etas: Sequence[float] = DEFAULT_ETAS, lambdas: Sequence[float] = DEFAULT_LAMBDAS,
                        eps: float = 1e-3, segment_len: int = 20,
                        names: Sequence[str] | None = None) -> tuple[DynamicEvalConfig, list[dict]]:
    """Pick eta and lambda of dynamic evaluation on validation documents (grid search).

    Every ``(eta, lambda)`` pair of ``etas x lambdas`` runs :func:`dynamic_evaluate` on
    ``valid_batches``; the lowest validation perplexity wins (ties: the first in grid order).

    Args:
        model: the trained static LM.
        valid_batches: ``DocumentBatch`` objects of validation data (read once per grid point).
        stats: :func:`collect_grad_stats` output for this model.
        etas, lambdas: the grid.
        eps, segment_len: fixed settings of every grid point.
        names: the adapted parameters (see :func:`dynamic_evaluate`).

    Returns:
        ``(best config, grid)`` where grid lists ``{"eta", "lambda", "ppl", "loss"}`` in grid order.
    """
    if not etas or not lambdas:
        raise ValueError("choose_dynamic_eval: the eta and lambda grids must not be empty")
    valid_batches = list(valid_batches)  # read once per grid point
    grid, best = [], None
    for eta in etas:
        for lam in lambdas:
            cfg = DynamicEvalConfig(lr=float(eta), decay=float(lam), eps=eps, segment_len=segment_len)
            metrics = dynamic_evaluate(model, valid_batches, cfg, stats, names=names)
            grid.append({"eta": cfg.lr, "lambda": cfg.decay, "ppl": metrics["ppl"], "loss": metrics["loss"]})
            loss = metrics["loss"] if math.isfinite(metrics["loss"]) else math.inf  # a diverged point loses
            if best is None or loss < best[0]:
                best = (loss, cfg)
    return best[1], grid
