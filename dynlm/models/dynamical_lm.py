"""Meta-learned dynamical language model (Wolf, Chaumond & Delangue, 2018).

An :class:`~dynlm.models.rnn_lm.RNNLM` whose weights in use are ``theta + theta_hat``:

* ``theta`` (``self.lm``) is static, trained by the outer optimizer like any LM;
* ``theta_hat`` (in the state, one copy per document ``[B, *shape]``) is a medium-term
  memory: 0 at each document start, and after every ``segment_len`` positions it is updated by
  the coordinate-wise meta-learner ``g_phi`` (:mod:`dynlm.modules.meta_learner`) from the
  gradient of that segment's mean NLL (per document) w.r.t. ``theta_hat``. Each segment is scored BEFORE
  its own update, with ``batch.targets`` / ``batch.mask`` (the LM hidden state is the
  short-term memory).

The update rule contains dynamic evaluation (Krause et al., 2018) as its initial value: the
model holds each fast tensor's RMS gradient statistics (buffers ``prior.*``, set by
:meth:`DynamicalLM.init_from_dynamic_eval` from :func:`dynlm.dynamic_eval.collect_grad_stats`)
and the meta-learner's gates start at exactly 1, so before meta-training the model evaluates
exactly like :func:`dynlm.dynamic_eval.dynamic_evaluate` restricted to the same weights
(documents read alone, same ``segment_len``); meta-training learns corrections to that rule.
That equality is exact for a fast output layer. For fast embedding / recurrent weights the
gradient fed to the update is truncated at evaluation where dynamic evaluation's is not: at
each chunk (the recurrent state is detached per chunk and per sentence), so it is close to but
not equal to Krause et al.'s (measured on a toy model: 1e-4 relative in the loss).

Which tensors get a fast part is ``cfg.dynamical.fast_params``: ``output`` (decoder weight and
bias), ``embedding`` (the word table, needs ``embedding="word"``), ``recurrent`` (``weight_hh``
of every layer). The embedding runs the static module with weights ``theta + theta_hat[b]``
through ``torch.func.functional_call`` vectorized over documents with ``torch.func.vmap``
(:func:`dynlm.modules.fast_weights.per_document_call`); the module parameters themselves are
never replaced. The output layer is ``decoder(x) + x[b] theta_hat[b]^T`` (one ``baddbmm``, no
``theta + theta_hat`` built: :func:`dynlm.modules.fast_weights.fast_linear`) in training; evaluation
holds ``theta + theta_hat`` (below). The recurrent
layers use explicit batched LSTM/GRU cells (a Python loop over positions, slower), as torch has
no vmap rule for the fused RNN ops.

Training: the outer loss of segment s backpropagates through the updates that made
``theta_hat``, to ``phi`` and ``theta``; the unroll is truncated after ``unroll_steps``
updates (and at every :meth:`detach_state`, i.e. each BPTT chunk of the training loop).
``first_order`` drops second derivatives (the gradient fed to g_phi is a constant);
``checkpoint_unroll`` recomputes the meta-learner's activations in the backward pass;
``compile_update`` fuses the element-wise update at evaluation into one ``torch.compile`` kernel
(and the closed-form path's softmax gradient into another).
Segments may span sentences: the gradient of a partial segment is accumulated in the state
(of the summed NLL: the sum of partial gradients is the segment's; it is divided by the
segment's token count at the update).

Evaluation needs gradients, so the class sets ``needs_grad_at_eval = True`` (the evaluate loop
then runs under ``torch.enable_grad``); in eval mode the returned state and logits are detached
and the update itself runs under ``torch.no_grad`` (no graph). With a fast output layer only,
evaluation takes the closed-form path (no autograd at all):

* each chunk keeps ``d nll / d logits = softmax - onehot`` (:func:`_output_layer_nll_and_dlogits`)
  in ``state.pending``, and the update makes the segment's gradient ``dlogits^T h`` as one
  product over the segment's chunks (:func:`_output_layer_grads`);
* the state holds the output weight in use, ``theta + theta_hat`` (``state.output_weight``,
  ``[B, V, H]``), instead of ``theta_hat``: the logits are one product (two with ``theta_hat``),
  and the update writes the new weights into the buffer of the segment's gradient (no new
  ``[B, V, H]`` tensor per segment). :meth:`DynamicalLM.theta_hat` gives theta_hat back.

Segments are counted in columns of the batch (``state.segment_pos`` is one number for all rows).
A chunk layout whose chunks are ``segment_len`` positions reads each segment in one chunk, and a
document's segments are then its own ``segment_len`` tokens, as when it is read alone (what
:meth:`dynlm.tasks.lm.LMTask.evaluation_layout` makes evaluation use). In sentence lockstep a segment
that spans sentences is read in several chunks, each a product with the ``[B, V, H]`` weights
(``benchmarks/bench_dynamical_speed.py`` measures both), and padded columns of a short sentence
count towards the segment of its row.

Dynamic evaluation of this model (:func:`dynlm.dynamic_eval.dynamic_scores`, adapting theta on
top of theta_hat) sets ``graph_at_eval = True`` meanwhile (so the autograd path): the eval-mode
logits then keep their graph to theta (the RNN state is still detached at every chunk, so that
gradient is truncated there, and theta_hat's updates are constants to it); what the model computes
is unchanged. In training mode each output's ``extras["gate_stats"]`` holds the mean and std of
both gates over the updates of that forward (the training loop averages them into its metrics,
see :func:`dynlm.training.train_step`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dynlm.dynamic_eval import DynamicEvalConfig, rms_priors
from dynlm.models.config import ModelConfig
from dynlm.models.outputs import LMOutput, accepts_sentence_lists
from dynlm.models.rnn_lm import RNNLM, RNNState
from dynlm.modules.fast_weights import (
    fast_embedding,
    fast_gru_layer,
    fast_linear,
    fast_lstm_layer,
    per_document_linear,
    slice_columns,
    zero_fast_weights,
)
from dynlm.modules.meta_learner import PREPROCESS_P, Gates, MetaLearner, UpdatePrior
from dynlm.vocab_spec import VocabSpec


def dynamical_lm_small(**overrides) -> ModelConfig:
    """A small dynamical LM for tests and smoke runs (64-dim LSTM, fast output layer)."""
    dynamical = dict(fast_params=["output"], meta_hidden_dim=0, segment_len=16, unroll_steps=4)
    dynamical.update(overrides.pop("dynamical", {}))
    cfg = dict(type="dynamical", backbone="lstm", embed_dim=64, hidden_dim=64, num_layers=1,
               dropout=0.1, dynamical=dynamical)
    return ModelConfig.from_dict({**cfg, **overrides})


@dataclass
class DynamicalState:
    """Recurrent state of :class:`DynamicalLM` (all tensors have the documents first).

    Attributes:
        lm: the RNN hidden state (short-term memory).
        fast: name -> theta_hat ``[B, *shape]`` (medium-term memory).
        grad: name -> gradient of the current, unfinished segment ``[B, *shape]`` (of the summed
            NLL; when ``segment_pos`` is 0 it is the last segment's, which the next chunk replaces).
        segment_loss: ``[B]`` summed NLL of the current segment; segment_tokens: ``[B]`` its tokens.
        segment_pos: positions read in the current segment (shared: documents move in lockstep).
        unrolled: updates since the last truncation of the unroll.
        pending: evaluation with a fast output layer only (the closed-form path): the current
            segment's chunks as ``(dlogits [B, l, V], hidden [B, l, H])`` pairs; the segment's
            gradient is one product over them at the update (``grad`` is not used then).
        output_weight: the same path: ``decoder.weight + fast["output.weight"]`` ``[B, V, H]``, so
            that the logits are one product; made by the update (valid while theta is unchanged).
    """

    lm: RNNState
    fast: dict[str, torch.Tensor]
    grad: dict[str, torch.Tensor]
    segment_loss: torch.Tensor
    segment_tokens: torch.Tensor
    segment_pos: int = 0
    unrolled: int = 0
    pending: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    output_weight: torch.Tensor | None = None


class DynamicalLM(nn.Module):
    """theta (an RNNLM) + per-document theta_hat updated by a meta-learner g_phi.

    Args:
        cfg: model config; ``cfg.dynamical`` holds the meta-learner settings.
        spec: vocabulary sizes.
    """

    needs_grad_at_eval = True
    needs_whole_sentences = False  # a sentence may be read in pieces (the segment carries)
    graph_at_eval = False  # eval outputs keep their graph to theta (dynamic evaluation sets it)
    closed_form_grad_at_eval = True  # a fast output layer's eval gradient without autograd (False: autograd)

    def __init__(self, cfg: ModelConfig, spec: VocabSpec):
        super().__init__()
        settings = cfg.dynamical
        if settings.segment_len <= 0 or settings.unroll_steps <= 0:
            raise ValueError("model.dynamical.segment_len and unroll_steps must be positive")
        if not settings.fast_params:
            raise ValueError("model.dynamical.fast_params is empty: nothing would be dynamic")
        if "embedding" in settings.fast_params and cfg.embedding != "word":
            raise ValueError("model.dynamical.fast_params 'embedding' needs model.embedding='word', "
                             f"got {cfg.embedding!r}")
        self.cfg, self.spec, self.settings = cfg, spec, settings
        self.lm = RNNLM(cfg, spec)
        self.meta_learner = MetaLearner(settings.meta_hidden_dim, settings.eta, settings.decay,
                                        gate_form=settings.gate_form)
        self._log_stats: dict[str, tuple[tuple, torch.Tensor]] = {}  # name -> (stamp, log statistic): _priors
        # Dynamic evaluation's per-coordinate statistics; without init_from_dynamic_eval every
        # rms is 1 (the step is eta * grad / (1 + eps), the decay uniform).
        self.prior = nn.Module()
        for name, target in self.fast_targets().items():
            key = _buffer_key(name)
            self.prior.register_buffer(f"{key}_denominator", torch.full_like(target.detach(), 1.0 + settings.eps))
            self.prior.register_buffer(f"{key}_decay_rate", torch.ones_like(target.detach()))

    # ----- parameters ---------------------------------------------------------------------
    def fast_targets(self) -> dict[str, torch.Tensor]:
        """name -> the static parameter each fast tensor is added to."""
        targets = {}
        if "output" in self.settings.fast_params:
            targets["output.weight"] = self.lm.decoder.weight
            targets["output.bias"] = self.lm.decoder.bias
        if "embedding" in self.settings.fast_params:
            targets["embedding.weight"] = self.lm.embedding.word.weight
        if "recurrent" in self.settings.fast_params:
            for layer in range(self.cfg.num_layers):
                targets[f"recurrent.weight_hh_l{layer}"] = getattr(self.lm.rnn, f"weight_hh_l{layer}")
        return targets

    def adapted_parameter_names(self) -> dict[str, str]:
        """fast tensor name -> the static parameter's name in ``self.lm.named_parameters()``."""
        by_id = {id(p): name for name, p in self.lm.named_parameters()}
        return {name: by_id[id(target)] for name, target in self.fast_targets().items()}

    def init_from_dynamic_eval(self, cfg: DynamicEvalConfig, stats: dict[str, torch.Tensor]) -> None:
        """Start the update rule at dynamic evaluation with ``cfg``'s eta, lambda and eps.

        Args:
            cfg: dynamic evaluation settings (e.g. :func:`dynlm.dynamic_eval.choose_dynamic_eval`'s
                pick); its ``segment_len`` must be the model's.
            stats: :func:`dynlm.dynamic_eval.collect_grad_stats` of ``self.lm`` (or of a static
                LM with the same parameter names); only the fast tensors' entries are used.
        """
        if cfg.segment_len != self.settings.segment_len:
            raise ValueError(f"init_from_dynamic_eval: segment_len {cfg.segment_len} != the model's "
                             f"{self.settings.segment_len}")
        names = self.adapted_parameter_names()
        missing = sorted(lm_name for lm_name in names.values() if lm_name not in stats)
        if missing:
            raise ValueError(f"init_from_dynamic_eval: no statistics for {missing}")
        priors = rms_priors({name: stats[lm_name] for name, lm_name in names.items()}, cfg.eps, cfg.decay)
        with torch.no_grad():
            for name, prior in priors.items():
                key = _buffer_key(name)
                getattr(self.prior, f"{key}_denominator").copy_(prior.denominator)
                getattr(self.prior, f"{key}_decay_rate").copy_(prior.decay_rate)
        self.meta_learner.set_rule(cfg.lr, cfg.decay)

    def _priors(self) -> dict[str, UpdatePrior]:
        """Each fast tensor's statistics, with the meta-learner's feature ``log(denominator) / p``
        kept between updates (recomputed when the denominator buffer is written, moved or cast).
        A buffer made under ``torch.inference_mode`` has no version counter to tell a write, so
        its statistic is recomputed at every update instead."""
        priors = {}
        for name in self.fast_targets():
            key = _buffer_key(name)
            denominator = getattr(self.prior, f"{key}_denominator")
            decay_rate = getattr(self.prior, f"{key}_decay_rate")
            if torch.is_inference(denominator):  # no kept statistic: UpdatePrior computes it per update
                priors[name] = UpdatePrior(denominator, decay_rate)
                continue
            stamp = (denominator.data_ptr(), denominator._version, denominator.dtype, denominator.device)
            kept = self._log_stats.get(name)
            if kept is None or kept[0] != stamp:
                kept = (stamp, denominator.detach().log() / PREPROCESS_P)  # [*shape]
                self._log_stats[name] = kept
            priors[name] = UpdatePrior(denominator, decay_rate, kept[1])
        return priors

    def param_groups(self, base_lr: float) -> list[dict]:
        """Optimizer groups: theta at ``base_lr``, phi at ``cfg.dynamical.meta_lr``."""
        return [{"params": list(self.lm.parameters()), "lr": base_lr, "name": "lm"},
                {"params": list(self.meta_learner.parameters()), "lr": self.settings.meta_lr,
                 "name": "meta_learner"}]

    # ----- state ----------------------------------------------------------------------------
    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> DynamicalState:
        """theta_hat = 0 and a zero RNN state for ``batch_size`` documents."""
        lm = self.lm.init_state(batch_size, device)
        dtype = self.lm.decoder.weight.dtype
        lm = RNNState(lm.h.to(dtype), None if lm.c is None else lm.c.to(dtype))
        fast = {k: v.to(lm.h.device) for k, v in zero_fast_weights(self.fast_targets(), batch_size).items()}
        zeros = torch.zeros(batch_size, device=lm.h.device, dtype=dtype)
        return DynamicalState(lm, fast, dict(fast), zeros, zeros.clone())  # grad: the same read-only zeros

    def theta_hat(self, state: DynamicalState) -> dict[str, torch.Tensor]:
        """name -> theta_hat ``[B, *shape]`` of every fast tensor in ``state`` (on the closed-form
        evaluation path the output weight is held as ``theta + theta_hat``: this subtracts theta)."""
        fast = dict(state.fast)
        if state.output_weight is not None:
            fast["output.weight"] = state.output_weight - self.lm.decoder.weight.detach()  # [B, V, H]
        return fast

    def _without_closed_form_parts(self, state: DynamicalState) -> DynamicalState:
        """``state`` with theta_hat in ``fast`` and the pending chunks' gradient in ``grad`` (what
        the autograd path reads), from a state that the closed-form evaluation path made."""
        grad = dict(state.grad)
        if state.pending:
            with torch.no_grad():
                grad.update(_output_layer_grads(list(state.pending), state.output_weight.dtype))
        return dataclasses.replace(state, fast=self.theta_hat(state), grad=grad, pending=(), output_weight=None)

    def detach_state(self, state: DynamicalState) -> DynamicalState:
        """Cut all autograd history (also truncates the meta-learner unroll)."""
        return DynamicalState(RNNLM.detach_state(state.lm), {k: v.detach() for k, v in state.fast.items()},
                              {k: v.detach() for k, v in state.grad.items()}, state.segment_loss.detach(),
                              state.segment_tokens.detach(), state.segment_pos, 0,
                              tuple((d.detach(), h.detach()) for d, h in state.pending),
                              None if state.output_weight is None else state.output_weight.detach())

    def reset_state(self, state: DynamicalState, keep: torch.Tensor) -> DynamicalState:
        """Zero RNN state, theta_hat and the pending segment of rows where ``keep`` [B] is False."""
        keep = keep.to(state.segment_loss.device)

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t * keep.view((-1,) + (1,) * (t.dim() - 1)).to(t.dtype)

        output_weight = state.output_weight
        if output_weight is not None:  # theta_hat = 0 in the reset rows: the static weight
            output_weight = torch.where(keep.view(-1, 1, 1), output_weight, self.lm.decoder.weight.detach())
        return dataclasses.replace(
            state, lm=RNNLM.reset_state(state.lm, keep), fast={k: rows(v) for k, v in state.fast.items()},
            grad={k: rows(v) for k, v in state.grad.items()}, segment_loss=rows(state.segment_loss),
            segment_tokens=rows(state.segment_tokens),
            pending=tuple((rows(d), rows(h)) for d, h in state.pending), output_weight=output_weight)

    # ----- forward --------------------------------------------------------------------------
    @accepts_sentence_lists
    def forward(self, batch, state: DynamicalState) -> tuple[LMOutput, DynamicalState]:
        """Score one sentence batch with theta + theta_hat, updating theta_hat every segment_len positions.

        Args:
            batch: a ``SentenceBatch`` (a list of them -> list of outputs, see ``accepts_sentence_lists``).
            state: the state before the sentence.

        Returns:
            ``LMOutput`` (logits ``[B, L, V_out]``, hidden ``[B, L, H]``) and the new state.
        """
        if not torch.is_grad_enabled():
            raise RuntimeError("DynamicalLM needs autograd to update its fast weights: call it under "
                               "torch.enable_grad() (needs_grad_at_eval = True)")
        training = self.training
        keep_graph = training or self.graph_at_eval  # the outputs' graph to theta
        create_graph = training and not self.settings.first_order
        # At evaluation the gradient of a fast output layer has a closed form (see
        # _output_layer_nll_and_dlogits): no graph, no backward pass.
        closed_form = (self.closed_form_grad_at_eval and not keep_graph
                       and set(state.fast) <= {"output.weight", "output.bias"})
        state, fast, pending, output_weight = self._fast_tensors(state, closed_form)
        lm_state, grad = state.lm, dict(state.grad)
        seg_loss, seg_tokens, seg_pos, unrolled = state.segment_loss, state.segment_tokens, state.segment_pos, state.unrolled
        logits_parts, hidden_parts, gate_stats = [], [], []
        length, pos = batch.tokens.size(1), 0
        while pos < length:
            take = min(self.settings.segment_len - seg_pos, length - pos)
            chunk = slice_columns(batch, pos, pos + take)
            if closed_form:  # eval, fast output layer only: no autograd at all
                logits, hidden, lm_state, nll, dlogits = self._score_closed_form(chunk, lm_state, fast, output_weight)
                pending.append((dlogits, hidden))  # the segment's gradient is made at the update
            else:
                logits, hidden, lm_state = self._score(chunk, lm_state, fast)
                nll = _segment_nll(logits, chunk.targets, chunk.mask)  # [B] summed NLL of the chunk
                grad = self._add_chunk_grads(nll, fast, grad, seg_pos, create_graph, keep_graph)
            seg_loss = seg_loss + (nll if create_graph else nll.detach())
            seg_tokens = seg_tokens + chunk.mask.sum(dim=1).to(seg_tokens.dtype)
            seg_pos += take
            pos += take
            if not training:
                lm_state = RNNLM.detach_state(lm_state)
            if not keep_graph:
                logits, hidden = logits.detach(), hidden.detach()
            logits_parts.append(logits)
            hidden_parts.append(hidden)
            if seg_pos == self.settings.segment_len:
                if closed_form:  # the segment's gradient: one product over its chunks (state.grad unused)
                    with torch.no_grad():
                        segment_grad = _output_layer_grads(pending, hidden.dtype)
                        fast, output_weight = self._update(fast, segment_grad, seg_loss, seg_tokens, None,
                                                           output_weight)
                    pending = []
                else:
                    with torch.set_grad_enabled(training):  # no graph for the update at evaluation
                        fast, _ = self._update(fast, grad, seg_loss, seg_tokens, gate_stats if training else None)
                unrolled += 1
                if closed_form:
                    unrolled = 0
                elif not training or unrolled >= self.settings.unroll_steps:
                    fast = {k: v.detach().requires_grad_(True) for k, v in fast.items()}
                    unrolled = 0
                # the next segment's first chunk replaces the gradients (no zero tensors to add to)
                grad = {k: v.detach() for k, v in grad.items()}
                seg_loss, seg_tokens, seg_pos = torch.zeros_like(seg_loss).detach(), torch.zeros_like(seg_tokens), 0
        if not training:
            fast = {k: v.detach() for k, v in fast.items()}
            grad = {k: v.detach() for k, v in grad.items()}
        extras = {"gate_stats": _mean_gate_stats(gate_stats)} if gate_stats else {}
        output = LMOutput(logits=torch.cat(logits_parts, dim=1), hidden=torch.cat(hidden_parts, dim=1), extras=extras)
        return output, DynamicalState(lm_state, fast, grad, seg_loss, seg_tokens, seg_pos, unrolled,
                                      tuple(pending), output_weight)

    def _fast_tensors(self, state: DynamicalState, closed_form: bool):
        """``(state, fast, pending, output_weight)`` that :meth:`forward` starts from.

        On the closed-form path the output weight is held as ``theta + theta_hat`` from here on
        (taken out of ``fast``); on the autograd path a closed-form state is turned back into
        theta_hat and ``grad``, and the fast tensors become leaves that require grad.
        """
        if closed_form:
            fast = dict(state.fast)  # no autograd on this path
            output_weight = state.output_weight
            if "output.weight" in fast:
                with torch.no_grad():
                    output_weight = self.lm.decoder.weight + fast.pop("output.weight")  # [B, V, H]
            return state, fast, list(state.pending), output_weight
        if state.output_weight is not None:  # a state of the closed-form path: back to theta_hat and grad
            state = self._without_closed_form_parts(state)
        fast = {k: v if v.requires_grad else v.detach().requires_grad_(True) for k, v in state.fast.items()}
        return state, fast, [], None

    def _score_closed_form(self, chunk, lm_state: RNNState, fast: dict[str, torch.Tensor], output_weight):
        """One chunk on the closed-form path: logits, hidden, RNN state, summed NLL ``[B]`` and
        ``d nll / d logits`` ``[B, l, V]`` (kept until the update), all without a graph."""
        with torch.no_grad():
            logits, hidden, lm_state = self._score(chunk, lm_state, fast, output_weight)
            nll_and_dlogits = (self._compiled_nll_and_dlogits() if self.settings.compile_update
                               else _output_layer_nll_and_dlogits)
            nll, dlogits = nll_and_dlogits(logits, chunk.targets, chunk.mask)
        return logits, hidden, lm_state, nll, dlogits

    @staticmethod
    def _add_chunk_grads(nll, fast, grad, seg_pos: int, create_graph: bool, keep_graph: bool) -> dict:
        """``grad`` with the chunk's gradient of ``nll.sum()`` w.r.t. every fast tensor added (the
        autograd path); the segment's first chunk (``seg_pos`` 0) replaces the earlier segment's."""
        names = list(fast)
        grads = torch.autograd.grad(nll.sum(), [fast[k] for k in names], create_graph=create_graph,
                                    retain_graph=keep_graph, allow_unused=True)
        grad = dict(grad)
        for name, g in zip(names, grads):
            if g is not None:
                grad[name] = g if seg_pos == 0 else grad[name] + g
            elif seg_pos == 0:  # no path reached the tensor: its segment gradient is zero so far
                grad[name] = torch.zeros_like(fast[name]).detach()
        return grad

    def _update(self, fast, grad, seg_loss, seg_tokens, gate_stats: list | None,
                output_weight: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """One meta-learned update of theta_hat for documents that had tokens in the segment.

        ``gate_stats`` (training only) receives one dict of detached gate statistics per tensor.
        ``output_weight`` (evaluation, closed-form path): ``theta + theta_hat`` of the output layer
        ``[B, V, H]``, held instead of ``fast["output.weight"]``; its update is written into the
        buffer of ``grad["output.weight"]`` (this segment's own: no new ``[B, V, H]`` tensor).
        Returns the new fast tensors and the new ``output_weight`` (None when not given).
        """
        mean_loss = seg_loss / seg_tokens.clamp(min=1)  # [B]
        has_tokens = seg_tokens > 0
        all_have_tokens = bool(has_tokens.all())  # the usual case: no masking pass needed
        priors = self._priors()
        decays = self.training or bool(self.meta_learner.lam > 0)  # lam = 0: no forget gate at evaluation
        tokens = seg_tokens.clamp(min=1)  # [B]: the update divides grad by it (the mean segment NLL's)
        fused = self.settings.compile_update and not self.training
        new = {}
        for name, value in fast.items():
            shape = (-1,) + (1,) * (value.dim() - 1)
            if self.settings.checkpoint_unroll and self.training:
                updated, input_gate, forget_gate = checkpoint(
                    _update_tensors, self.meta_learner, value, grad[name], tokens, mean_loss, priors[name],
                    use_reentrant=False)
            elif not self.training:  # evaluation: the new weights alone (no gates kept, no graph)
                update = self._compiled_update() if fused else _updated_tensor
                updated = update(self.meta_learner, value, grad[name], tokens, mean_loss, priors[name], decays)
            else:
                updated, input_gate, forget_gate = _update_tensors(self.meta_learner, value, grad[name], tokens,
                                                                   mean_loss, priors[name])
            if gate_stats is not None:
                gate_stats.append(_gate_summary(Gates(input_gate.detach(), forget_gate.detach())))
            new[name] = updated if all_have_tokens else torch.where(has_tokens.view(shape), updated, value)
        if output_weight is not None:
            update = self._compiled_update(in_use=True) if fused else _updated_weights_into_grad
            output_weight = update(self.meta_learner, output_weight, self.lm.decoder.weight, grad["output.weight"],
                                   tokens, mean_loss, priors["output.weight"], decays,
                                   None if all_have_tokens else has_tokens)
        return new, output_weight

    def _compiled_update(self, in_use: bool = False):
        """:func:`_updated_tensor` (``in_use``: :func:`_updated_weights_into_grad`) fused by
        ``torch.compile`` (built on first use, kept per model)."""
        key = "_compiled_update_in_use_fn" if in_use else "_compiled_update_fn"
        compiled = self.__dict__.get(key)
        if compiled is None:
            compiled = torch.compile(_updated_weights_into_grad if in_use else _updated_tensor)
            self.__dict__[key] = compiled  # a plain attribute: not in the state dict
        return compiled

    def _compiled_nll_and_dlogits(self):
        """:func:`_output_layer_nll_and_dlogits` fused by ``torch.compile`` (dynamic chunk length)."""
        compiled = self.__dict__.get("_compiled_nll_and_dlogits_fn")
        if compiled is None:
            compiled = torch.compile(_output_layer_nll_and_dlogits, dynamic=True)
            self.__dict__["_compiled_nll_and_dlogits_fn"] = compiled  # not in the state dict
        return compiled

    def _score(self, chunk, lm_state: RNNState, fast: dict[str, torch.Tensor],
               output_weight: torch.Tensor | None = None):
        """Logits ``[B, l, V]``, hidden ``[B, l, H]`` and the new RNN state for one chunk.

        ``output_weight``: ``decoder.weight + fast["output.weight"]`` ``[B, V, H]`` when the caller
        has it (the logits are then one product instead of two).
        """
        lm = self.lm
        # In eval with only a fast output layer nothing below the decoder needs a graph.
        below_needs_graph = self.training or self.graph_at_eval or any(not k.startswith("output.") for k in fast)
        with torch.set_grad_enabled(below_needs_graph):
            if "embedding.weight" in fast:  # embedding="word": lm.embed(chunk) is the word table alone
                # the word module maps off-short-list ids to <unk>; pad rows get no fast part
                x = fast_embedding(lm.embedding.word, chunk.tokens, fast["embedding.weight"])  # [B, l, E]
            else:
                x = lm.embed(chunk)  # [B, l, E]
            x = lm.input_dropout(x)
            if any(k.startswith("recurrent.") for k in fast):
                hidden, lm_state = self._run_fast_rnn(x, lm_state, fast, chunk)
            else:
                hidden, lm_state = lm.run_rnn(x, lm_state, getattr(chunk, "lengths", None))
        dropped = lm.output_dropout(hidden)
        if output_weight is not None:
            logits = per_document_linear(dropped, output_weight, lm.decoder.bias + fast["output.bias"])  # [B, l, V]
        elif "output.weight" in fast:
            logits = fast_linear(lm.decoder, dropped, fast["output.weight"], fast["output.bias"])  # [B, l, V]
        else:
            logits = lm.decoder(dropped)
        return lm.mask_entities(logits, chunk), hidden, lm_state

    def _run_fast_rnn(self, x, lm_state: RNNState, fast, chunk):
        """The recurrent layers with fast ``weight_hh`` (rows past ``chunk.lengths`` keep their state)."""
        rnn = self.lm.rnn
        lengths = getattr(chunk, "lengths", None)
        if lengths is None:
            lengths = chunk.mask.sum(dim=1)
        active = torch.arange(x.size(1), device=x.device).unsqueeze(0) < lengths.to(x.device).unsqueeze(1)
        hs, cs = [], []
        for layer in range(self.cfg.num_layers):
            if layer > 0 and self.training and self.cfg.dropout > 0:
                x = F.dropout(x, self.cfg.dropout)
            args = (getattr(rnn, f"weight_ih_l{layer}"), getattr(rnn, f"weight_hh_l{layer}"),
                    getattr(rnn, f"bias_ih_l{layer}", None), getattr(rnn, f"bias_hh_l{layer}", None),
                    fast[f"recurrent.weight_hh_l{layer}"])
            if self.cfg.backbone == "lstm":
                x, (h, c) = fast_lstm_layer(x, (lm_state.h[layer], lm_state.c[layer]), *args, active=active)
                cs.append(c)
            else:
                x, h = fast_gru_layer(x, lm_state.h[layer], *args, active=active)
            hs.append(h)
        return x, RNNState(torch.stack(hs), torch.stack(cs) if cs else None)


def _segment_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed NLL per document ``[B]`` (float32 at least, float64 kept for gradient checks)."""
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [B, L]
    return (nll * mask.to(nll.dtype)).sum(dim=1)


def _output_layer_nll_and_dlogits(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL per document ``[B]`` and its gradient w.r.t. the logits ``[B, l, V]``, in closed form.

    ``d nll / d logits = (softmax - onehot) * mask``: with it a fast output layer's gradient needs
    no autograd (:func:`_output_layer_grads`).
    """
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)  # [B, l, V]
    weights = mask.to(log_probs.dtype)  # [B, l]
    index = targets.unsqueeze(-1)  # [B, l, 1]
    nll = -(log_probs.gather(-1, index).squeeze(-1) * weights).sum(dim=1)  # [B]
    dlogits = log_probs.exp_()  # softmax, in place (the gather above copied what it needs)
    dlogits.scatter_add_(-1, index, torch.full_like(index, -1.0, dtype=dlogits.dtype))
    return nll, dlogits.mul_(weights.unsqueeze(-1))


def _output_layer_grads(pending: list[tuple[torch.Tensor, torch.Tensor]], dtype: torch.dtype
                        ) -> dict[str, torch.Tensor]:
    """The gradient of a segment's summed NLL w.r.t. a fast output layer ``h W^T + b``.

    ``pending`` holds the segment's chunks as ``(dlogits [B, l, V], hidden [B, l, H])`` (no dropout:
    evaluation). ``dW[b] = dlogits[b]^T h[b]`` (``[B, V, H]``) over all the segment's positions at
    once (one ``bmm``: a product per chunk would write ``[B, V, H]`` once per chunk) and
    ``db[b] = sum_l dlogits[b, l]`` (``[B, V]``): what ``torch.autograd.grad`` of
    :func:`_segment_nll` gives, without a graph. Returns ``output.weight`` and ``output.bias`` in ``dtype``.
    """
    dlogits = torch.cat([d for d, _ in pending], dim=1) if len(pending) > 1 else pending[0][0]  # [B, P, V]
    hidden = torch.cat([h for _, h in pending], dim=1) if len(pending) > 1 else pending[0][1]  # [B, P, H]
    return {"output.weight": torch.bmm(dlogits.transpose(1, 2), hidden.to(dlogits.dtype)).to(dtype),  # [B, V, H]
            "output.bias": dlogits.sum(dim=1).to(dtype)}  # [B, V]


def _buffer_key(name: str) -> str:
    """A fast tensor name as a buffer name (``output.weight`` -> ``output_weight``)."""
    return name.replace(".", "_")


def _mean_grad(summed_grad: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean segment NLL: ``summed_grad [B, *shape]`` over ``tokens [B]``."""
    return summed_grad / tokens.view((-1,) + (1,) * (summed_grad.dim() - 1))


def _update_tensors(meta_learner: MetaLearner, fast, summed_grad, tokens, loss, prior: UpdatePrior):
    """``meta_learner.update`` with :func:`_mean_grad`, returning plain tensors ``(new fast,
    input gate, forget gate)``."""
    updated, gates = meta_learner.update(fast, _mean_grad(summed_grad, tokens), loss, prior)
    return updated, gates.input_gate, gates.forget_gate


def _updated_tensor(meta_learner: MetaLearner, fast, summed_grad, tokens, loss, prior: UpdatePrior,
                    decays: bool) -> torch.Tensor:
    """The new fast weights of :func:`_update_tensors` alone (evaluation; ``decays``: lam > 0)."""
    return meta_learner.updated(fast, _mean_grad(summed_grad, tokens), loss, prior, decays)


def _updated_weights_into_grad(meta_learner: MetaLearner, weights, static, summed_grad, tokens, loss,
                               prior: UpdatePrior, decays: bool, has_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`_updated_tensor` for a fast tensor held as the weights in use, ``weights = static + fast``.

    Returns ``weights + (new fast - fast)``, written into ``summed_grad``'s buffer (the segment's
    own gradient, not needed after the update; :meth:`MetaLearner.updated_into`): no new
    ``[B, *shape]`` tensor is returned, and fused by ``torch.compile`` it is one pass.
    ``has_tokens`` ``[B]`` (None: all): documents without tokens in the segment keep ``weights``.
    """
    mean_grad = summed_grad.div_(tokens.view((-1,) + (1,) * (summed_grad.dim() - 1)))  # in place
    if torch.compiler.is_compiling():  # one fused kernel over every document
        new = meta_learner.updated_into(mean_grad, weights - static, loss, prior, decays, weights=weights)
        if has_tokens is None:
            return new
        return new.copy_(torch.where(has_tokens.view((-1,) + (1,) * (new.dim() - 1)), new, weights))
    # eager: document by document, so that the temporaries are [*shape] (cache-sized, reused by the
    # allocator) rather than [B, *shape] (fresh pages at every segment); a document without tokens
    # (e.g. one that has ended) costs a copy
    active = [True] * weights.size(0) if has_tokens is None else has_tokens.tolist()
    for b, has in enumerate(active):
        if has:
            meta_learner.updated_into(mean_grad[b:b + 1], weights[b:b + 1] - static, loss[b:b + 1], prior, decays,
                                      weights=weights[b:b + 1])
        else:
            mean_grad[b].copy_(weights[b])
    return mean_grad


def _gate_summary(gates: Gates) -> dict[str, torch.Tensor]:
    """Mean and std of both gates (scalars) over every coordinate of one update."""
    return {"gate_input_mean": gates.input_gate.mean(), "gate_input_std": gates.input_gate.std(),
            "gate_forget_mean": gates.forget_gate.mean(), "gate_forget_std": gates.forget_gate.std()}


def _mean_gate_stats(summaries: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Average the per-update gate summaries of one forward (scalar tensors)."""
    return {key: torch.stack([s[key] for s in summaries]).mean() for key in summaries[0]}
