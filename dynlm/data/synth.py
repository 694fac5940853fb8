"""A synthetic coreference corpus where entity context is needed to predict the text.

Each document introduces 2-4 people with made-up names (pronounceable, from syllables) and
attributes unique within the document: a profession, a home town and a pet of some colour.
Later sentences mention them again by name (full or first name) or pronoun, so that

* predicting WHICH entity appears needs its earlier context:
  ``The baker from Kelmoor , Tamo , sat by the river .`` (only one baker in the document);
* predicting what FOLLOWS a mention needs it: ``Tamo fed the grey cat .``

Every name / pronoun mention of a person is annotated with the person's chain; distractor
sentences add singleton mentions (one-off names, places). The vocabulary is a few hundred words.
Documents are deterministic given (seed, document index), whatever ``num_documents`` is, and are
written as LitBank-style 13-column CoNLL files so that the real reader path runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from dynlm.config import Config, ConfigError

SYLLABLES = (
    "ka", "mo", "ril", "ten", "bel", "dor", "sa", "vin", "lo", "mar", "ti", "nel",
    "ra", "jo", "ke", "lin", "da", "fen", "go", "ha", "mi", "sor", "tu", "wen",
)
LAST_SUFFIXES = ("son", "ley", "wick", "ton", "ar", "is")
TOWNS = (
    "Kelmoor", "Ashford", "Brindle", "Dunmere", "Elkstone", "Farrow", "Glenwick",
    "Hollin", "Islay", "Juniper", "Lowdale", "Marrow",
)
PROFESSIONS = (
    "baker", "smith", "weaver", "miller", "tailor", "potter", "farmer", "fisher",
    "carpenter", "painter", "healer", "teacher", "cobbler", "mason",
)
ANIMALS = ("cat", "dog", "goat", "horse", "owl", "rabbit", "parrot", "pig", "duck", "mouse")
COLOURS = ("grey", "black", "white", "brown", "red", "golden", "spotted", "green", "blue", "striped")
ACTIONS = (
    ("walked", "to", "the", "market"), ("sat", "by", "the", "river"), ("sang", "a", "song"),
    ("read", "a", "letter"), ("fell", "asleep"), ("laughed", "loudly"), ("cooked", "supper"),
    ("climbed", "the", "hill"), ("waited", "at", "the", "gate"), ("counted", "the", "coins"),
)
PLACES = ("bridge", "tower", "mill", "inn", "well", "chapel", "orchard", "harbour")
STRANGERS = ("a", "stranger"), ("an", "old", "woman"), ("a", "young", "soldier"), ("a", "pedlar")
PRONOUNS = {"f": ("She", "she", "her"), "m": ("He", "he", "his")}


@dataclass
class SynthConfig(Config):
    """Sizes of the synthetic corpus.

    Args:
        num_documents: documents generated.
        seed: base seed; document i uses its own generator seeded by (seed, i).
        docs_per_file: documents per CoNLL file.
        min_entities / max_entities: people per document (each gets unique attributes).
        events_per_document: later sentences that mention a person again.
        distractors_per_document: sentences with singleton mentions only.
    """

    num_documents: int = 300
    seed: int = 0
    docs_per_file: int = 50
    min_entities: int = 2
    max_entities: int = 4
    events_per_document: int = 10
    distractors_per_document: int = 2

    def validate(self) -> None:
        if self.num_documents < 1 or self.docs_per_file < 1:
            raise ConfigError("num_documents and docs_per_file must be >= 1")
        if not 1 <= self.min_entities <= self.max_entities <= min(len(PROFESSIONS), len(ANIMALS), len(COLOURS)):
            raise ConfigError(
                f"need 1 <= min_entities <= max_entities <= {min(len(PROFESSIONS), len(ANIMALS), len(COLOURS))}"
            )
        if self.events_per_document < 0 or self.distractors_per_document < 0:
            raise ConfigError("events_per_document and distractors_per_document must be >= 0")


def make_name(rng: random.Random, syllables: int) -> str:
    """A pronounceable made-up name such as ``Kamoril``."""
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


class _DocumentWriter:
    """Collects sentences and mentions (sentence, start, end, chain) of one document."""

    def __init__(self):
        self.sentences: list[list[str]] = []
        self.mentions: list[tuple[int, int, int, str]] = []
        self.next_singleton = 1000

    def add(self, *parts) -> None:
        """parts: plain words (str / tuple of str) or (chain, words) pairs given as lists."""
        tokens: list[str] = []
        for part in parts:
            if isinstance(part, list):  # [chain, words] -> a mention
                chain, words = part
                if chain is None:
                    chain = str(self.next_singleton)
                    self.next_singleton += 1
                self.mentions.append((len(self.sentences), len(tokens), len(tokens) + len(words) - 1, chain))
                tokens.extend(words)
            elif isinstance(part, tuple):
                tokens.extend(part)
            else:
                tokens.append(part)
        self.sentences.append(tokens)


def _generate_document(cfg: SynthConfig, index: int) -> dict:
    rng = random.Random(f"dynlm-synth:{cfg.seed}:{index}")
    num_entities = rng.randint(cfg.min_entities, cfg.max_entities)
    professions = rng.sample(PROFESSIONS, num_entities)
    towns = rng.sample(TOWNS, num_entities)
    animals = rng.sample(ANIMALS, num_entities)
    colours = rng.sample(COLOURS, num_entities)
    people = []
    used_names: set[str] = set()
    for k in range(num_entities):
        first = make_name(rng, rng.randint(2, 3))
        while first in used_names:
            first = make_name(rng, rng.randint(2, 3))
        used_names.add(first)
        last = make_name(rng, 2) + rng.choice(LAST_SUFFIXES)
        people.append({
            "chain": str(k), "first": first, "full": (first, last), "gender": rng.choice("fm"),
            "prof": professions[k], "town": towns[k], "animal": animals[k], "colour": colours[k],
        })

    doc = _DocumentWriter()

    def name(p, full=None):
        words = p["full"] if (full if full is not None else rng.random() < 0.3) else (p["first"],)
        return [p["chain"], tuple(words)]

    def pronoun(p, kind):
        return [p["chain"], (PRONOUNS[p["gender"]][kind],)]

    for p in people:  # introductions
        if rng.random() < 0.5:
            doc.add(name(p, True), "was", "a", p["prof"], "from", p["town"], ".")
            doc.add(pronoun(p, 0), "had", "a", p["colour"], p["animal"], ".")
        else:
            doc.add("In", p["town"], "lived", "a", p["prof"], "named", name(p, True), ".")
            doc.add(name(p), "owned", "a", p["colour"], p["animal"], ".")

    slots = ["event"] * cfg.events_per_document + ["distractor"] * cfg.distractors_per_document
    rng.shuffle(slots)
    for slot in slots:
        if slot == "distractor":
            place = rng.choice(PLACES)
            if rng.random() < 0.5:
                one_off = (make_name(rng, 2), make_name(rng, 2) + rng.choice(LAST_SUFFIXES))
                doc.add([None, one_off], "waved", "from", [None, ("the", place)], ".")
            else:
                stranger = rng.choice(STRANGERS)
                doc.add([None, (stranger[0].capitalize(), *stranger[1:])], "stopped", "at",
                        [None, ("the", place)], ".")
            continue
        p = rng.choice(people)
        kind = rng.randrange(8)
        action = rng.choice(ACTIONS)
        if kind == 0:
            doc.add("The", p["prof"], "from", p["town"], ",", name(p), ",", action, ".")
        elif kind == 1:
            doc.add(name(p), "fed", "the", p["colour"], p["animal"], ".")
        elif kind == 2:
            doc.add(name(p), "went", "home", "to", p["town"], ".")
        elif kind == 3:
            doc.add(name(p), "worked", "all", "day", "as", "a", p["prof"], ".")
        elif kind == 4:
            doc.add("Everyone", "in", p["town"], "knew", name(p), ".")
        elif kind == 5:
            doc.add(name(p), action, ".")
            doc.add(pronoun(p, 0), "fed", "the", p["colour"], p["animal"], ".")
        elif kind == 6:
            doc.add("The", p["colour"], p["animal"], "followed", name(p), ".")
        else:
            doc.add(name(p), "and", pronoun(p, 2), p["colour"], p["animal"], action, ".")

    mentions = sorted(doc.mentions, key=lambda m: (m[0], m[1], -m[2], m[3]))
    return {
        "doc_id": f"synth_{cfg.seed}_{index:05d}/part_0",
        "source_file": f"synth_{index // cfg.docs_per_file:03d}.conll",
        "sentences": doc.sentences,
        "mentions": [{"sentence": s, "start": b, "end": e, "chain": c} for s, b, e, c in mentions],
    }


def generate(cfg: SynthConfig) -> list[dict]:
    """Generate the corpus as DOCUMENT_SCHEMA dicts (``source_file`` = the CoNLL file name)."""
    return [_generate_document(cfg, i) for i in range(cfg.num_documents)]


def conll_lines(doc: dict) -> list[str]:
    """A document as LitBank-style 13-column CoNLL lines (tab-separated, coreference last)."""
    name = doc["doc_id"].rsplit("/part_", 1)[0]
    marks: dict[tuple[int, int], list[str]] = {}
    for m in doc["mentions"]:
        s, b, e, c = m["sentence"], m["start"], m["end"], m["chain"]
        if b == e:
            marks.setdefault((s, b), []).append(f"({c})")
        else:
            marks.setdefault((s, b), []).append(f"({c}")
            marks.setdefault((s, e), []).append(f"{c})")
    lines = [f"#begin document ({name}); part 0"]
    for s, tokens in enumerate(doc["sentences"]):
        for t, word in enumerate(tokens):
            lines.append("\t".join([name, "0", str(t), word] + ["_"] * 8 + ["|".join(marks.get((s, t), []))]))
        lines.append("")
    lines.append("#end document")
    return lines


def write_conll(cfg: SynthConfig, out_dir: str | Path) -> list[Path]:
    """Write the corpus as ``synth_000.conll`` ... (``docs_per_file`` documents each).

    Returns:
        The written file paths, in order.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    for doc in generate(cfg):
        files.setdefault(doc["source_file"], []).extend(conll_lines(doc))
    paths = []
    for file_name, lines in files.items():
        path = out_dir / file_name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
