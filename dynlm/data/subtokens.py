"""Identifier names <-> lower-cased subtokens (the naming models' vocabulary), and back.

Allamanis et al. (2015) generate a method name subtoken by subtoken: ``getHTTPServer`` and
``get_http_server`` are the same name, ``get http server``. :func:`split_subtokens` gives the
subtokens; :func:`name_style` what the split loses (underscores, case convention, how digits sit),
so that :func:`join_subtokens` can write any subtoken sequence (a model's suggestion) in the
style of a given function, and gives the name back for a regular name::

    split_subtokens("_read_HTTPServer2")       -> ["read", "http", "server", "2"]  (irregular: mixed)
    split_subtokens("__init__")                -> ["init"]
    join_subtokens(["get", "value"], name_style("_isReady"))  -> "_getValue"

Split rules:

* leading and trailing underscores are not subtokens: they go to the style (``leading``,
  ``trailing``), so ``__init__``, ``_init`` and ``init`` are the same name to the models (the
  words are what a model predicts; privacy and dunder-ness are kept by the function's style);
* the rest is cut at underscores (empty pieces dropped), then at case changes: a lower-case letter
  followed by an upper-case one (``getValue``), and before the last upper-case letter of a run
  that is followed by a lower-case one (``HTTPServer`` -> ``HTTP``, ``Server``);
* a run of digits is its own subtoken (``b64encode`` -> ``b``, ``64``, ``encode``);
* subtokens are lower-cased. A name of underscores only (``_``) has no subtoken.

Round trip: ``join_subtokens(split_subtokens(n), name_style(n)) == n`` for every name except
those :func:`round_trip_exception` names (a test checks both directions over stdlib packages):

* ``inner_double_underscore``: ``__`` inside the name (``_read_ready__on_eof``: one ``_`` comes back);
* ``mixed_case_snake``: underscores and both cases (``visit_FunctionDef``, ``do_GET``): written
  back as lower snake_case;
* ``acronym``: camelCase / PascalCase with a subtoken of two or more upper-case letters
  (``HTTPServer``, ``getURL``; not ``XQuartz``, ``RLock``): written back capitalised (``HttpServer``);
* ``digit_after_lower_camel``: camelCase / PascalCase with a lower-case letter right after a
  digit (``getItem2nd``: ``getItem2Nd``);
* ``digit_glue``: snake_case / UPPER_CASE whose digit runs are not all glued the same way
  (``encode_7or8bit``): see :class:`NameStyle`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Case = Literal["snake", "upper_snake", "camel", "pascal"]
DigitGlue = Literal["left", "both", "right", "none"]
CASES: tuple[str, ...] = ("snake", "upper_snake", "camel", "pascal")
# Tried in this order; a name without digits gets the first ("left": read1, sha256, log10).
DIGIT_GLUES: tuple[str, ...] = ("left", "both", "right", "none")
ROUND_TRIP_EXCEPTIONS = ("inner_double_underscore", "mixed_case_snake", "acronym", "digit_after_lower_camel",
                         "digit_glue")


@dataclass(frozen=True)
class NameStyle:
    """How a name writes its subtokens.

    Attributes:
        leading / trailing: the underscores before / after the words (``"__"`` for a dunder).
        case: ``snake`` (get_value), ``upper_snake`` (GET_VALUE), ``camel`` (getValue),
            ``pascal`` (GetValue). A single lower-case word is ``snake``.
        digit_glue: snake / upper_snake only (camel and Pascal never separate a digit): whether a
            digit subtoken is written without an underscore after the subtoken before it
            (``left``: read1, log10_exp), before the one after it too (``both``: b64encode,
            lin2alaw), only before the one after it (``right``: _round_05up), or neither
            (``none``: utf_8).
    """

    leading: str = ""
    trailing: str = ""
    case: Case = "snake"
    digit_glue: DigitGlue = "left"

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"unknown name case {self.case!r} (known: {', '.join(CASES)})")
        if self.digit_glue not in DIGIT_GLUES:
            raise ValueError(f"unknown digit_glue {self.digit_glue!r} (known: {', '.join(DIGIT_GLUES)})")
        if set(self.leading + self.trailing) - {"_"}:
            raise ValueError(f"leading/trailing must be underscores, got {self.leading!r} / {self.trailing!r}")


def _strip_underscores(name: str) -> tuple[str, str, str]:
    """``(leading underscores, core, trailing underscores)``; a name of underscores only is all leading."""
    core = name.strip("_")
    if not core:
        return name, "", ""
    leading = name[: len(name) - len(name.lstrip("_"))]
    return leading, core, name[len(leading) + len(core):]


def _char_kind(char: str) -> str:
    """``digit``, ``upper`` or ``lower`` (any other letter: uncased scripts read as lower)."""
    if char.isdigit():
        return "digit"
    return "upper" if char.isupper() else "lower"


def _split_piece(piece: str) -> list[str]:
    """The subtokens (original case) of an underscore-free piece: digit runs, case changes."""
    tokens: list[str] = []
    start = 0
    for i in range(1, len(piece)):
        before, here = _char_kind(piece[i - 1]), _char_kind(piece[i])
        after = _char_kind(piece[i + 1]) if i + 1 < len(piece) else ""
        cut = ((before == "digit") != (here == "digit")
               or (before == "lower" and here == "upper")
               or (before == "upper" and here == "upper" and after == "lower"))
        if cut:
            tokens.append(piece[start:i])
            start = i
    if piece:
        tokens.append(piece[start:])
    return tokens


def _core_tokens(core: str) -> list[str]:
    return [token for piece in core.split("_") if piece for token in _split_piece(piece)]


def split_subtokens(name: str) -> list[str]:
    """The lower-cased subtokens of ``name`` (rules in the module docstring)."""
    return list(_split_cached(name))


@lru_cache(maxsize=1 << 16)
def _split_cached(name: str) -> tuple[str, ...]:  # identifiers repeat a lot within a corpus
    return tuple(token.lower() for token in _core_tokens(_strip_underscores(name)[1]))


def _case_of(core: str) -> Case:
    has_upper = any(c.isupper() for c in core)
    has_lower = any(c.islower() for c in core)
    if not has_upper:
        return "snake"
    if not has_lower:
        return "upper_snake"
    if "_" in core:
        return "snake"  # mixed_case_snake: no regular style; written back lower
    first_letter = next(c for c in core if c.isalpha())
    return "camel" if first_letter.islower() else "pascal"


def _digit_boundaries(core: str) -> tuple[set[bool], set[bool]]:
    """For every digit run of a snake/upper core: is it glued to the subtoken before it / after it
    (sets of the values seen; a run at the start or end of the core has no before / after)."""
    before: set[bool] = set()
    after: set[bool] = set()
    i = 0
    while i < len(core):
        if not core[i].isdigit():
            i += 1
            continue
        j = i
        while j < len(core) and core[j].isdigit():
            j += 1
        if i > 0 and core[:i].strip("_"):
            before.add(core[i - 1] != "_")
        if j < len(core) and core[j:].strip("_"):
            after.add(core[j] != "_")
        i = j
    return before, after


_GLUE_SIDES = {"left": (True, False), "both": (True, True), "right": (False, True), "none": (False, False)}


def _digit_glue_of(core: str) -> DigitGlue | None:
    """The first rule of DIGIT_GLUES that every digit run of ``core`` follows; None: none does."""
    before, after = _digit_boundaries(core)
    for glue in DIGIT_GLUES:
        glue_before, glue_after = _GLUE_SIDES[glue]
        if before <= {glue_before} and after <= {glue_after}:
            return glue
    return None


def name_style(name: str) -> NameStyle:
    """The style of ``name``: its underscores, case convention and digit rule (a name of an
    irregular style, see :func:`round_trip_exception`, gets the closest regular one)."""
    leading, core, trailing = _strip_underscores(name)
    case = _case_of(core)
    glue = _digit_glue_of(core) if case in ("snake", "upper_snake") else None
    return NameStyle(leading, trailing, case, glue or "left")


def round_trip_exception(name: str) -> str | None:
    """Why ``join_subtokens(split_subtokens(name), name_style(name))`` is not ``name`` (one of
    :data:`ROUND_TRIP_EXCEPTIONS`), or None when it is. Decided from the characters of the name
    alone, not by trying the round trip."""
    core = _strip_underscores(name)[1]
    if "__" in core:
        return "inner_double_underscore"
    has_upper = any(c.isupper() for c in core)
    has_lower = any(c.islower() for c in core)
    if "_" in core and has_upper and has_lower:
        return "mixed_case_snake"
    if has_upper and has_lower:  # camel / Pascal
        if _has_acronym(core):
            return "acronym"
        if any(a.isdigit() and b.islower() for a, b in zip(core, core[1:])):
            return "digit_after_lower_camel"
        return None
    if _digit_glue_of(core) is None:
        return "digit_glue"
    return None


def _has_acronym(core: str) -> bool:
    """A run of upper-case letters that keeps two or more of them in one subtoken: of length 2+,
    or 3+ when a lower-case letter follows (whose subtoken takes the run's last letter:
    ``XQuartz`` is X + Quartz, ``HTTPServer`` is HTTP + Server)."""
    i = 0
    while i < len(core):
        j = i
        while j < len(core) and core[j].isupper():
            j += 1
        followed_by_lower = j < len(core) and core[j].islower()
        if j - i - followed_by_lower >= 2:
            return True
        i = max(j, i + 1)
    return False


def join_subtokens(subtokens: list[str] | tuple[str, ...], style: NameStyle | str = "snake") -> str:
    """``subtokens`` written as one name in ``style`` (a :class:`NameStyle`, or a case name:
    ``"camel"`` is ``NameStyle(case="camel")``). The inverse of :func:`split_subtokens` given
    :func:`name_style` of the name (exceptions: :func:`round_trip_exception`)."""
    if isinstance(style, str):
        style = NameStyle(case=style)  # type: ignore[arg-type]
    words = [token.lower() for token in subtokens]
    if style.case == "upper_snake":
        words = [word.upper() for word in words]
    elif style.case in ("camel", "pascal"):
        words = [word if i == 0 and style.case == "camel" else word[:1].upper() + word[1:]
                 for i, word in enumerate(words)]
        return style.leading + "".join(words) + style.trailing
    glue_before, glue_after = _GLUE_SIDES[style.digit_glue]
    out = words[0] if words else ""
    for previous, word in zip(words, words[1:]):
        glued = (word.isdigit() and glue_before) or (previous.isdigit() and glue_after)
        out += ("" if glued else "_") + word
    return style.leading + out + style.trailing


__all__ = ["NameStyle", "ROUND_TRIP_EXCEPTIONS", "join_subtokens", "name_style", "round_trip_exception",
           "split_subtokens"]
