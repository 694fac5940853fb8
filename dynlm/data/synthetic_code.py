"""A small synthetic Python corpus whose function names follow from their bodies.

The naming task's learning test and the README example need code where a model can beat the
most-frequent-name baseline in seconds. Each file holds a few classes; a class has some fields
(``price``, ``owner_name`` ...) and, per field, methods of a few kinds whose NAME is what their
BODY does to that field::

    class Invoice:
        def __init__(self, price, owner_name):
            self._price = price
            ...
        def get_price(self):                  return self._price
        def set_price(self, value):           self._price = value
        def has_price(self):                  return self._price is not None
        def load_price(self, path):           with open(path) as handle: self._price = json.load(handle)
        def reset_price(self):                self._price = None
        def count_price(self):                return len(self._price)

plus module functions ``parse_<field>(text)`` and a ``describe_<class>(item)`` that calls some
getters (so methods have callers). Noise: some methods get another verb's name (``fetch_price``
for a getter), some bodies an unrelated statement (a debug print, a temporary), and a file
writes its methods in camelCase (``getPrice``) with some probability. Files are
deterministic given (seed, file index), whatever ``num_files`` is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from dynlm.config import Config, ConfigError
from dynlm.data.subtokens import join_subtokens

CLASS_NOUNS = ("invoice", "sensor", "account", "order", "ticket", "device", "report", "parcel", "session",
               "player", "recipe", "garden", "vehicle", "library", "camera", "budget")
FIELDS = ("price", "owner", "name", "path", "status", "count", "items", "label", "color", "weight", "address",
          "title", "score", "tags", "speed", "level", "owner_name", "file_path", "start_time", "user_id")
# verb -> body template over the field ({f}); the verb is the name's first subtoken
METHOD_BODIES = {
    "get": ["return self._{f}"],
    "set": ["self._{f} = value"],
    "has": ["return self._{f} is not None"],
    "load": ["with open(path) as handle:", "    self._{f} = json.load(handle)"],
    "reset": ["self._{f} = None"],
    "count": ["return len(self._{f})"],
}
METHOD_PARAMETERS = {"set": ["value"], "load": ["path"]}  # besides self
NOISE_VERBS = ("fetch", "update", "check", "read", "clear", "size")
NOISE_STATEMENTS = ("print('debug')", "tmp = 0", "logger.debug('called')")


@dataclass
class SynthCodeConfig(Config):
    """Sizes and noise of the synthetic code corpus.

    Args:
        num_files: files written (``module_000.py`` ...).
        seed: base seed; file i uses its own generator seeded by (seed, i).
        classes_per_file: classes per file.
        fields_per_class: fields per class (each gets 2-4 of the method kinds).
        name_noise: probability that a method gets another verb's name.
        body_noise: probability that a method's body gets an unrelated first statement.
        camel_case_files: probability that a file writes its method names in camelCase.
    """

    num_files: int = 40
    seed: int = 0
    classes_per_file: int = 2
    fields_per_class: int = 3
    name_noise: float = 0.05
    body_noise: float = 0.2
    camel_case_files: float = 0.2

    def validate(self) -> None:
        for name in ("num_files", "classes_per_file", "fields_per_class"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.fields_per_class > len(FIELDS):
            raise ConfigError(f"fields_per_class: at most {len(FIELDS)}, got {self.fields_per_class}")
        for name in ("name_noise", "body_noise", "camel_case_files"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}: must be in [0, 1], got {getattr(self, name)}")


def _method(rng: random.Random, cfg: SynthCodeConfig, verb: str, field: str, case: str) -> list[str]:
    name_verb = rng.choice(NOISE_VERBS) if rng.random() < cfg.name_noise else verb
    name = join_subtokens([name_verb, *field.split("_")], case)
    body = [line.format(f=field) for line in METHOD_BODIES[verb]]
    if rng.random() < cfg.body_noise:
        body.insert(0, rng.choice(NOISE_STATEMENTS))
    parameters = ", ".join(["self", *METHOD_PARAMETERS.get(verb, [])])
    return [f"    def {name}({parameters}):", *[f"        {line}" for line in body], ""]


def _class(rng: random.Random, cfg: SynthCodeConfig, noun: str, case: str) -> tuple[list[str], list[str]]:
    """The class's lines and the fields that have a getter."""
    fields = rng.sample(FIELDS, cfg.fields_per_class)
    lines = [f"class {noun.capitalize()}:", f'    """A {noun}."""', "",
             f"    def __init__(self, {', '.join(fields)}):", *[f"        self._{f} = {f}" for f in fields], ""]
    with_getter = []
    for field in fields:
        verbs = sorted(rng.sample(sorted(METHOD_BODIES), rng.randint(2, 4)))
        with_getter += [field] if "get" in verbs else []
        for verb in verbs:
            lines += _method(rng, cfg, verb, field, case)
    return lines, with_getter


def generate_code_file(cfg: SynthCodeConfig, index: int) -> str:
    """The source of file ``index`` (deterministic given ``cfg.seed`` and ``index``)."""
    rng = random.Random(cfg.seed * 1_000_003 + index)
    case = "camel" if rng.random() < cfg.camel_case_files else "snake"
    lines = ['"""Synthetic module."""', "", "import json", "", ""]
    getters = {}
    for noun in rng.sample(CLASS_NOUNS, cfg.classes_per_file):
        class_lines, getters[noun] = _class(rng, cfg, noun, case)
        lines += class_lines + [""]
    for noun, fields in getters.items():  # a caller of the class's getters (callers of get_*)
        calls = " + ".join(f"str(item.{join_subtokens(['get', *f.split('_')], case)}())" for f in fields) or "''"
        lines += [f"def {join_subtokens(['describe', noun], case)}(item):", f"    return {calls}", "", ""]
    field = rng.choice(FIELDS)
    lines += [f"def {join_subtokens(['parse', *field.split('_')], case)}(text):",
              f"    {field} = text.strip()", f"    return {field}", ""]
    return "\n".join(lines)


def write_code_corpus(cfg: SynthCodeConfig, out: str | Path) -> list[Path]:
    """Write ``module_000.py`` ... into ``out`` (created); returns the paths."""
    cfg.validate()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(cfg.num_files):
        path = folder / f"module_{index:03d}.py"
        path.write_text(generate_code_file(cfg, index), encoding="utf-8")
        paths.append(path)
    return paths


__all__ = ["SynthCodeConfig", "generate_code_file", "write_code_corpus"]
