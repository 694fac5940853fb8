"""Functions and their features from Python source (dynlm/data/python_functions.py)."""

from __future__ import annotations

import textwrap

import pytest

from dynlm.data.python_functions import UnparseableSource, extract_functions, is_dunder

SNIPPET = textwrap.dedent('''\
    import functools

    class Box:
        """A box."""

        def __init__(self, value: int):
            self._value = value  # the value

        @property
        def value(self) -> int:
            return self._value

        @value.setter
        def value(self, new):
            self._value = new

        async def fetch(self, *keys, **options):
            return await self.load(keys, timeout=options)


    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)


    def outer(items):
        square = lambda x: x * x

        @functools.lru_cache(maxsize=2)
        def inner(item):
            return Box(square(item)).value
        return [inner(i) for i in items]
    ''')


def test_every_def_at_any_depth_with_qualname_class_and_line_lambdas_ignored():
    records = extract_functions(SNIPPET, "snippet.py", max_context_size=4)
    assert [(r["qualname"], r["name"], r["lineno"], r["class_name"]) for r in records] == [
        ("Box.__init__", "__init__", 6, "Box"),
        ("Box.value", "value", 10, "Box"),
        ("Box.value", "value", 14, "Box"),
        ("Box.fetch", "fetch", 17, "Box"),
        ("fib", "fib", 21, ""),
        ("outer", "outer", 25, ""),
        ("outer.<locals>.inner", "inner", 29, ""),
    ]


def test_features_exact():
    features = {r["lineno"]: r["features"] for r in extract_functions(SNIPPET, "snippet.py")}
    assert features[6] == ["class:Box", "arg:self", "arg:value", "ann:int", "body:_value", "body:value", "body:self",
                           "sub:self", "sub:value"]
    # the property's first decorator part is its own name: only `setter`; own name never in body
    assert features[10] == ["class:Box", "decorator:property", "arg:self", "ret:int", "body:_value", "body:self",
                            "sub:self", "sub:value"]
    assert features[14] == ["class:Box", "decorator:setter", "arg:self", "arg:new", "body:_value", "body:new",
                            "body:self", "sub:self", "sub:new", "sub:value"]
    assert features[17] == ["class:Box", "arg:self", "arg:keys", "arg:options", "call:load", "body:load", "body:keys",
                            "body:timeout", "body:self", "body:options", "sub:self", "sub:keys", "sub:options",
                            "sub:load", "sub:timeout"]
    assert features[21] == ["arg:n", "body:n", "sub:n"]  # recursion: fib excluded
    assert features[29] == ["decorator:lru_cache", "arg:item", "caller:outer", "call:Box", "call:square",
                            "body:value", "body:Box", "body:square", "body:item", "sub:item", "sub:value", "sub:box",
                            "sub:square"]
    # the nested function's name and the lambda's parameter are identifiers of outer's body
    assert {"body:inner", "body:x", "call:inner", "sub:lru", "sub:cache"} <= set(features[25])
    assert not any(f.startswith("caller:") for f in features[25])


def test_callers_by_name_from_the_innermost_function_only():
    source = textwrap.dedent('''\
        def helper():
            pass

        def a():
            helper()
            def nested():
                return obj.helper()
            return nested

        def b():
            a()

        helper()
        ''')
    callers = {r["qualname"]: [f for f in r["features"] if f.startswith("caller:")]
               for r in extract_functions(source, "c.py")}
    assert callers == {"helper": ["caller:a", "caller:nested"], "a": ["caller:b"], "a.<locals>.nested": [],
                       "b": []}


def test_context_tokens_exact():
    records = {r["lineno"]: r for r in extract_functions(SNIPPET, "snippet.py", max_context_size=8)}
    assert records[6]["context_before"] == ["import", "functools", "<newline>", "class", "Box", ":", "<newline>",
                                            "<indent>", "<str>", "<newline>", "def"][-8:]
    assert records[6]["context_after"] == ["(", "self", ",", "value", ":", "int", ")", ":"]
    assert records[17]["context_before"] == [".", "_value", "=", "new", "<newline>", "<dedent>", "async", "def"]
    # own name in the window is <name>; a comment and the blank lines are not tokens
    assert records[21]["context_after"] == ["(", "n", ")", ":", "<newline>", "<indent>", "return", "n"]
    short = extract_functions("def f(n): return f(n)\n", "s.py", max_context_size=8)[0]
    assert short["context_before"] == ["def"]  # the start of the file: fewer than 8
    assert short["context_after"] == ["(", "n", ")", ":", "return", "<name>", "(", "n"]


def test_bytes_with_a_coding_cookie_and_a_non_ascii_column():
    source = "# -*- coding: latin-1 -*-\nclass \xc4:\n  def f(self): return '\xe9'\n".encode("latin-1")
    [record] = extract_functions(source, "latin.py", max_context_size=4)
    assert (record["qualname"], record["class_name"]) == ("\xc4.f", "\xc4")
    assert record["context_before"] == [":", "<newline>", "<indent>", "def"]
    assert extract_functions(b"\xef\xbb\xbfdef g():\r\n    pass\r\n", "bom.py")[0]["context_after"][:3] == ["(", ")", ":"]


@pytest.mark.parametrize("data, reason", [
    (b"def f(:\n    pass\n", "SyntaxError: invalid syntax"),
    (b"print 'py2'\n", "SyntaxError: Missing parentheses in call to 'print'"),
    (b"def f():\nreturn 1\n", "IndentationError: expected an indented block"),
    (b"x = 1\x00\n", "null bytes in source"),
    (b"# coding: uft-8\nx = 1\n", "bad encoding: unknown encoding: uft-8"),
    (b"x = '\xff'\n", "bad encoding: invalid or missing encoding declaration"),  # tokenize's check, lines 1-2
    (b"x = 1\ny = 2\nz = '\xff'\n", "bad encoding: 'utf-8' codec can't decode byte 0xff"),
])
def test_unparseable_source_raises_with_its_reason(data, reason):
    with pytest.raises(UnparseableSource, match="^bad.py: ") as caught:
        extract_functions(data, "bad.py")
    assert caught.value.reason.startswith(reason)
    assert caught.value.path == "bad.py"


OVERRIDES = textwrap.dedent('''\
    import socketserver

    class Base:
        def run(self):
            return 1

        def __eq__(self, other):
            return True

    class Middle(Base):
        pass

    class Leaf(Middle):
        def run(self):
            def run():
                return 2
            return run()

        def stop(self):
            return 0

        def __eq__(self, other):
            return False

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            return None

    def run():
        return 3
    ''')


def test_overrides_name_the_same_file_base_class_through_a_class_between():
    records = extract_functions(OVERRIDES, "overrides.py")
    assert [(r["qualname"], r["overrides"]) for r in records] == [
        ("Base.run", ""), ("Base.__eq__", ""),
        ("Leaf.run", "Base"),  # Leaf(Middle), Middle(Base): Base defines run
        ("Leaf.run.<locals>.run", ""),  # a nested function is no method
        ("Leaf.stop", ""),  # no base defines stop
        ("Leaf.__eq__", "Base"),
        ("Handler.handle", ""),  # the base is in another file: not seen
        ("run", ""),  # a module function overrides nothing
    ]


@pytest.mark.parametrize("name, expected", [("__init__", True), ("__eq__", True), ("__x__", True), ("_init_", False),
                                            ("__private", False), ("init__", False), ("____", False),
                                            ("_____", False), ("get", False)])
def test_is_dunder(name, expected):
    assert is_dunder(name) is expected
