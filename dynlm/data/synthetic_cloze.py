"""A synthetic cloze corpus in the CBT format, deterministic by seed (the cloze task's tests).

Each question's context introduces five people with made-up names (syllable strings, mostly
rare: off the word short list) and facts about them (``kavoru keeps the red lamp .``), padded
with filler sentences to 20 lines; the query restates one fact with the name blanked
(``XXXXX keeps the red lamp .``). The candidates are the five names and five other words of the
context, so chance is 10 %. Answering needs matching the query's fact to its sentence and
pointing at the name there: what the gated-attention reader does.
"""

from __future__ import annotations

import random
from pathlib import Path

from dynlm.data.cbt import BLANK, CONTEXT_LINES

SYLLABLES = ("ka", "vo", "ru", "mi", "te", "so", "lan", "dri", "pe", "zu", "qui", "no", "fa", "bel", "tor", "ix")
VERBS = ("keeps", "paints", "sells", "finds", "hides", "mends")
ADJECTIVES = ("red", "blue", "old", "small", "green", "heavy", "bright", "broken")
NOUNS = ("lamp", "boat", "cart", "drum", "kite", "coat", "bell", "map")
FILLERS = ("the day was long .", "it rained in the valley .", "a bird sang near the river .",
           "the market was busy .", "everyone went home late .")


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


def _question(rng: random.Random) -> str:
    names: list[str] = []
    while len(names) < 5:
        name = _name(rng)
        if name not in names:
            names.append(name)
    facts = [(name, rng.choice(VERBS), rng.choice(ADJECTIVES), rng.choice(NOUNS)) for name in names for _ in range(2)]
    facts = list({(v, a, n): (name, v, a, n) for name, v, a, n in facts}.values())  # a fact names one person
    sentences = [f"{name} {verb} the {adjective} {noun} ." for name, verb, adjective, noun in facts]
    sentences += [rng.choice(FILLERS) for _ in range(CONTEXT_LINES - len(sentences))]
    rng.shuffle(sentences)
    name, verb, adjective, noun = rng.choice(facts)
    others = sorted({w for s in sentences for w in s.split() if w in NOUNS or w in ADJECTIVES})
    candidates = sorted(names + rng.sample(others, min(5, len(others))))
    lines = [f"{i} {s}" for i, s in enumerate(sentences[:CONTEXT_LINES], start=1)]
    lines.append(f"{CONTEXT_LINES + 1} {BLANK} {verb} the {adjective} {noun} .\t{name}\t\t{'|'.join(candidates)}")
    return "\n".join(lines) + "\n\n"


def synthetic_cbt_text(num_questions: int, seed: int = 0) -> str:
    """``num_questions`` CBT blocks (the same text for the same arguments)."""
    rng = random.Random(seed)
    return "".join(_question(rng) for _ in range(num_questions))


def write_synthetic_cbt(out_dir: str | Path, num_questions: int, seed: int = 0) -> Path:
    """Write ``cbtest_NE_synthetic.txt`` into ``out_dir``; returns its path."""
    path = Path(out_dir) / "cbtest_NE_synthetic.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(synthetic_cbt_text(num_questions, seed), encoding="utf-8")
    return path
