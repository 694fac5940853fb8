"""The gated-attention reader: shapes, attention-sum probabilities, padding invariance, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from dynlm.config import ConfigError
from dynlm.data.bpe import SubwordTokenizer
from dynlm.data.preprocessor import Preprocessor
from dynlm.data.vocabulary import Vocabulary
from dynlm.models.ga_reader import GAReader, GAReaderConfig, answer_nll
from dynlm.tasks.cloze_data import collate_questions, encode_question

COUNTS = {"ann": 5, "met": 4, "bob": 4, ".": 9, "XXXXX": 3, "gave": 2, "a": 3, "book": 2, "zorvik": 1}


def _preprocessor(gamma: float = 0.5) -> Preprocessor:
    return Preprocessor(Vocabulary.from_counts(COUNTS, 100, gamma), SubwordTokenizer.train(COUNTS, 10), max_chains=0)


def _rows(preprocessor):
    questions = [("ann met bob . bob gave ann a book .", "XXXXX gave ann a book .", [], "bob"),
                 ("zorvik met ann .", "XXXXX met ann .", ["zorvik", "ann", "bob"], "zorvik")]
    return [{**encode_question(preprocessor, {"document": d.split(), "query": q.split(), "candidates": c, "answer": a}),
             "answer_class": "other"} for d, q, c, a in questions]


@pytest.mark.parametrize("embedding,combine", [("word", "concat"), ("subword", "concat"), ("word+subword", "concat"),
                                               ("word+subword", "sum"), ("word+subword", "mul")])
def test_candidate_probabilities_sum_to_the_attention_on_candidates(embedding, combine):
    preprocessor = _preprocessor()
    rows = _rows(preprocessor)
    batch = collate_questions(rows, preprocessor.spec).inputs
    model = GAReader(GAReaderConfig(embedding=embedding, combine=combine, embed_dim=8, subword_dim=4, hidden_size=6),
                     preprocessor.spec).eval()
    log_p = model(batch)
    assert log_p.shape == (2, 7)  # row 0: the document's 7 word types (no XXXXX); row 1: 3 candidates, padded
    total = log_p.exp().sum(dim=1)
    assert math.isclose(total[0].item(), 1.0, rel_tol=1e-5)  # every document token is a candidate
    attention = model.attention(batch)
    in_list = (batch.candidate_of_token[1] >= 0).float()
    assert math.isclose(total[1].item(), float((attention[1] * in_list).sum()), rel_tol=1e-5)
    assert log_p[1, 3:].tolist() == [float("-inf")] * 4


def test_a_question_scores_the_same_alone_and_padded_in_a_batch():
    preprocessor = _preprocessor()
    rows = _rows(preprocessor)
    model = GAReader(GAReaderConfig(embed_dim=8, subword_dim=4, hidden_size=6, dropout=0.0), preprocessor.spec).eval()
    together = model(collate_questions(rows, preprocessor.spec).inputs)
    alone = model(collate_questions(rows[1:], preprocessor.spec).inputs)
    assert torch.allclose(together[1, :3], alone[0], atol=1e-6)


def test_every_parameter_gets_a_gradient_and_the_loss_is_the_answer_nll():
    preprocessor = _preprocessor()
    batch = collate_questions(_rows(preprocessor), preprocessor.spec).inputs
    assert batch.answer.tolist() == [2, 0]  # "bob" is the third word type of document 0
    model = GAReader(GAReaderConfig(embed_dim=8, subword_dim=4, hidden_size=6), preprocessor.spec)
    log_p = model(batch)
    nll, count = answer_nll(log_p, batch.answer)
    assert count == 2 and math.isclose(nll.item(), -(log_p[0, 2] + log_p[1, 0]).item(), rel_tol=1e-6)
    nll.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_unknown_answers_add_nothing():
    log_p = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    nll, count = answer_nll(log_p, torch.tensor([1, -1]))
    assert count == 1 and math.isclose(nll.item(), math.log(2), rel_tol=1e-6)


def test_config_is_strict():
    with pytest.raises(ConfigError, match="hops"):
        GAReaderConfig.from_dict({"hops": 3})
    with pytest.raises(ConfigError):
        GAReaderConfig.from_dict({"embedding": "char"})
