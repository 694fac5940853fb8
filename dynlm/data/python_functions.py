"""Python source -> one record per function or method: its name and what may predict it.

The naming task (Allamanis, Barr, Bird, Sutton, "Suggesting Accurate Method and Class Names",
FSE 2015) predicts a function's name from its body. :func:`extract_functions` reads one file
with :mod:`ast` (the definitions) and :mod:`tokenize` (the token context) and returns, for every
``def`` / ``async def`` at any depth (methods, nested functions, decorated ones; lambdas have no
name and are not functions here)::

    {"name": "get_value", "qualname": "Box.get_value", "lineno": 12, "class_name": "Box", "overrides": "",
     "features": ["class:Box", "arg:self", "ret:int", "caller:show", "body:self", "body:_value", "sub:self",
                  "sub:value"],
     "context_before": ["<newline>", "<indent>", "def"], "context_after": ["(", "self", ")"]}

Features (typed strings, each once, in this order; the encoder keeps the first
``max_features_per_function`` that are in the vocabulary):

* ``class:C``: the class whose body defines the function (methods only);
* ``decorator:d``: the last dotted part of each decorator (``@functools.lru_cache(1)`` ->
  ``lru_cache``, ``@x.setter`` -> ``setter``: the first part of a property decorator is the
  function's own name);
* ``arg:a``: every parameter (``self``, ``*args`` -> ``args``, keyword-only, ``**kwargs``);
* ``ann:T`` / ``ret:T``: the identifiers of the parameter annotations / the return annotation
  (``Optional[Path]`` -> ``Optional``, ``Path``; string annotations are parsed);
* ``caller:g``: the functions of the same file that call this one (the rule below);
* ``call:f``: the names the body calls (``f(...)``, ``obj.f(...)``);
* ``body:x``: every identifier of the body (names, attribute names, keyword-argument names,
  parameters and names of nested functions and classes);
* ``sub:s``: the subtokens (:func:`dynlm.data.subtokens.split_subtokens`) of the parameters and
  of the body's identifiers.

Whole identifiers *and* subtokens: the paper's features are subtokens, which share evidence
across identifiers (``self._path``, ``path_len`` and ``load_path`` all say ``path``) and so
generalise to identifiers never seen in training; whole identifiers keep what the split loses
(``self`` vs a local ``s_elf``, ``isinstance`` vs ``is`` + ``instance``) and cost one vocabulary
entry each (rare ones fall below the feature vocabulary's min count). The function's own name
is excluded from ``call``, ``body`` and ``sub`` (as a whole identifier: ``return fib(n - 1)``,
``super().__init__()`` in ``__init__``), so recursion does not give the answer away.

Callers: ``g`` is a caller of ``f`` when a call ``f(...)`` or ``x.f(...)`` appears in ``g``'s
own body (not in a function nested in ``g``, whose caller that is) and ``g`` is not named
``f``. Calls are matched by name only: every function of the file named ``f`` (the ``__init__``
of each class) gets the callers of every call of ``f``; calls outside any function count for
none.

Overrides (``overrides``): the name of a base class *of the same file* that defines a method
of the same name, else "". A method of ``class C(B)`` overrides when ``B`` (a plain name, not
``mod.B`` or ``B[T]``) is a class of this file whose body defines that name, or one of ``B``'s
own same-file bases does (searched breadth first; the first found is given). Bases defined in
other files are not seen (``class Handler(socketserver.BaseRequestHandler)`` overrides
nothing here); classes are matched by name, so two classes of one name in a file count as
one. A nested function (``def`` inside a method) is no method and overrides nothing. The
paper leaves overriding methods out of its targets (the base class dictates their names);
:func:`is_dunder` names Python's own such case, ``__init__``, ``__eq__``...

Context tokens: the ``max_context_size`` tokens before and after the name token of the ``def``
in the file's token stream, nearest last / first. Comments and non-logical line breaks (NL) are
dropped; NEWLINE, INDENT, DEDENT are tokens ``<newline>``, ``<indent>``, ``<dedent>``; string
literals (docstrings included) are ``<str>``, numbers ``<num>``; the function's own name, where
it appears in the window (recursion right after the signature), is ``<name>``. Fewer tokens near
the start or end of the file: the lists are shorter (the encoder pads).
"""

from __future__ import annotations

import ast
import bisect
import io
import tokenize
from collections import defaultdict

from dynlm.data.subtokens import split_subtokens

DEFAULT_MAX_CONTEXT = 8
NAME_PLACEHOLDER = "<name>"
_TOKEN_NAMES = {tokenize.NEWLINE: "<newline>", tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>",
                tokenize.STRING: "<str>", tokenize.NUMBER: "<num>"}
_DROPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
# Python 3.12+ splits f-strings into tokens: the start is one <str>, its text pieces are dropped.
if hasattr(tokenize, "FSTRING_START"):
    _TOKEN_NAMES[tokenize.FSTRING_START] = "<str>"
    _DROPPED |= {tokenize.FSTRING_MIDDLE, tokenize.FSTRING_END}

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


class UnparseableSource(ValueError):
    """A file that is not Python source this interpreter can read (the record is quarantined).

    Attributes:
        path: the file; reason: what is wrong, in words; line: 1-based line (0: not tied to one).
    """

    def __init__(self, path: str, reason: str, line: int = 0):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.line = path, reason, line


def decode_source(data: bytes, path: str) -> str:
    """The text of a source file, decoded as Python does (PEP 263 coding cookie, BOM, else UTF-8).

    Raises:
        UnparseableSource: a bad coding cookie, bytes that are not in the declared encoding.
    """
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        return _raise(path, f"bad encoding: {exc}")


def _raise(path: str, reason: str, line: int = 0):
    raise UnparseableSource(path, reason, line)


def _parse(source: str, path: str) -> ast.Module:
    if "\x00" in source:
        _raise(path, "null bytes in source", source[: source.index("\x00")].count("\n") + 1)
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        return _raise(path, f"{type(exc).__name__}: {exc.msg}", exc.lineno or 0)
    except (ValueError, RecursionError, MemoryError) as exc:
        return _raise(path, f"{type(exc).__name__}: {exc}")


def context_stream(source: str, path: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The file's context tokens (rules in the module docstring) and their start positions."""
    tokens: list[str] = []
    starts: list[tuple[int, int]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in _DROPPED:
                continue
            tokens.append(_TOKEN_NAMES.get(token.type, token.string))
            starts.append(token.start)
    except (tokenize.TokenError, SyntaxError) as exc:
        _raise(path, f"tokenize: {exc}")
    return tokens, starts


def _identifiers(node: ast.AST | None) -> list[str]:
    """Names and attribute names in an annotation-like expression (string annotations parsed)."""
    found: list[str] = []
    if node is None:
        return found
    for item in ast.walk(node):
        if isinstance(item, ast.Name):
            found.append(item.id)
        elif isinstance(item, ast.Attribute):
            found.append(item.attr)
        elif isinstance(item, ast.Constant) and isinstance(item.value, str):
            try:
                found += _identifiers(ast.parse(item.value, mode="eval"))
            except (SyntaxError, ValueError, RecursionError):
                continue
    return found


def _decorator_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else None


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _body_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str]]:
    """(identifiers, called names) of the body, in source-walk order, repeats kept."""
    identifiers: list[str] = []
    calls: list[str] = []
    for statement in function.body:
        for item in ast.walk(statement):
            if isinstance(item, ast.Name):
                identifiers.append(item.id)
            elif isinstance(item, ast.Attribute):
                identifiers.append(item.attr)
            elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                identifiers.append(item.name)
            elif isinstance(item, ast.arg):
                identifiers.append(item.arg)
            elif isinstance(item, ast.keyword) and item.arg:
                identifiers.append(item.arg)
            if isinstance(item, ast.Call) and (called := _called_name(item)):
                calls.append(called)
    return identifiers, calls


def _parameters(args: ast.arguments) -> list[ast.arg]:
    return [*args.posonlyargs, *args.args, *([args.vararg] if args.vararg else []), *args.kwonlyargs,
            *([args.kwarg] if args.kwarg else [])]


def function_features(function: ast.FunctionDef | ast.AsyncFunctionDef, class_name: str,
                      callers: list[str]) -> list[str]:
    """The typed feature strings of one function (module docstring), each once, in order."""
    own = function.name
    parameters = _parameters(function.args)
    identifiers, calls = _body_names(function)
    identifiers = [name for name in identifiers if name != own]
    features = [f"class:{class_name}"] if class_name else []
    features += [f"decorator:{name}" for d in function.decorator_list if (name := _decorator_name(d)) and name != own]
    features += [f"arg:{p.arg}" for p in parameters]
    features += [f"ann:{name}" for p in parameters for name in _identifiers(p.annotation)]
    features += [f"ret:{name}" for name in _identifiers(function.returns)]
    features += [f"caller:{name}" for name in callers]
    features += [f"call:{name}" for name in calls if name != own]
    features += [f"body:{name}" for name in identifiers]
    words = dict.fromkeys([p.arg for p in parameters] + identifiers)
    features += [f"sub:{sub}" for name in words for sub in split_subtokens(name)]
    return list(dict.fromkeys(features))


def _callers_by_name(tree: ast.Module) -> dict[str, list[str]]:
    """``{called name: names of the functions whose own body calls it}`` (order of appearance)."""
    callers: dict[str, list[str]] = defaultdict(list)

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, _FUNCTIONS):
            for part in (*node.decorator_list, node.args, *([node.returns] if node.returns else [])):
                visit(part, function)  # decorators and defaults run in the enclosing scope
            for statement in node.body:
                visit(statement, node.name)
            return
        if isinstance(node, ast.Call) and function is not None and (called := _called_name(node)):
            if called != function and function not in callers[called]:
                callers[called].append(function)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return callers


def is_dunder(name: str) -> bool:
    """A "double underscore" name that Python itself gives its meaning (``__init__``,
    ``__eq__``, ``__getitem__``): ``__x__`` with something between the underscores. Its name is
    dictated by the language, not chosen for the body (the naming task can leave them out of
    its targets and reports them apart)."""
    return len(name) > 4 and name.startswith("__") and name.endswith("__") and name.strip("_") != ""


def _definitions(tree: ast.Module):
    """``(function node, qualname, class node)`` of every def, in source order. ``class node``:
    the class whose body (or an ``if`` / ``try`` in it) defines the function, else None."""
    found = []

    def visit(node: ast.AST, prefix: str, owner: ast.ClassDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _FUNCTIONS):
                found.append((child, prefix + child.name, owner))
                visit(child, prefix + child.name + ".<locals>.", None)
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".", child)
            else:
                visit(child, prefix, owner)

    visit(tree, "", None)
    return sorted(found, key=lambda item: (item[0].lineno, item[0].col_offset))


def _overridden_bases(tree: ast.Module, definitions) -> dict[int, str]:
    """``{id(method node): base class name}`` of every method (of ``definitions``, see
    :func:`_definitions`) that overrides a method of a same-file base class (the rule in the
    module docstring)."""
    methods: dict[str, set[str]] = defaultdict(set)  # class name -> the method names its body defines
    for function, _, owner in definitions:
        if owner is not None:
            methods[owner.name].add(function.name)
    bases: dict[str, list[str]] = defaultdict(list)  # class name -> its bases that are plain names
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases[node.name] = list(dict.fromkeys(
                [*bases[node.name], *(b.id for b in node.bases if isinstance(b, ast.Name))]))
    found: dict[int, str] = {}
    for function, _, owner in definitions:
        if owner is None:
            continue
        queue, seen = [b for b in bases[owner.name] if b != owner.name], {owner.name}
        while queue:
            base = queue.pop(0)
            if base in seen:
                continue
            seen.add(base)
            if function.name in methods.get(base, ()):
                found[id(function)] = base
                break
            queue += bases.get(base, [])
    return found


def extract_functions(source: str | bytes, path: str, *, max_context_size: int = DEFAULT_MAX_CONTEXT) -> list[dict]:
    """One record per function of ``source`` (module docstring), in source order.

    Args:
        source: the file's text, or its bytes (decoded by :func:`decode_source`).
        path: the file's name (in error messages).
        max_context_size: context tokens kept each side of the name (K_max).

    Raises:
        UnparseableSource: bad encoding, null bytes, a syntax error, a tokenize error.
    """
    if isinstance(source, bytes):
        source = decode_source(source, path)
    source = source.replace("\r\n", "\n").replace("\r", "\n")  # one line numbering for ast and tokenize
    tree = _parse(source, path)
    tokens, starts = context_stream(source, path)
    callers = _callers_by_name(tree)
    definitions = _definitions(tree)
    overridden = _overridden_bases(tree, definitions)
    records = []
    for function, qualname, owner in definitions:
        class_name = owner.name if owner is not None else ""
        # a def starts its logical line: its column (bytes in ast, characters in tokenize) is indentation
        index = bisect.bisect_left(starts, (function.lineno, function.col_offset))
        while tokens[index] != "def":  # `async def`, or `def` itself
            index += 1
        index += 1  # the name token
        if tokens[index] != function.name:
            _raise(path, f"the token after `def` at line {function.lineno} is not {function.name!r}", function.lineno)

        def window(part: list[str], name: str = function.name) -> list[str]:
            return [NAME_PLACEHOLDER if token == name else token for token in part]

        records.append({
            "name": function.name, "qualname": qualname, "lineno": function.lineno, "class_name": class_name,
            "overrides": overridden.get(id(function), ""),
            "features": function_features(function, class_name,
                                          [c for c in callers.get(function.name, []) if c != function.name]),
            "context_before": window(tokens[max(0, index - max_context_size): index]),
            "context_after": window(tokens[index + 1: index + 1 + max_context_size]),
        })
    return records


__all__ = ["UnparseableSource", "context_stream", "decode_source", "extract_functions", "function_features",
           "is_dunder"]
