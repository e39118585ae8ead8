"""JMS message selectors: SQL-92 conditional expressions over message headers.

Theory of operation
-------------------
``compile_selector(text)`` parses ``text`` once with a LALR grammar (lark, imported and
built at the first selector, so a broker nobody sends a selector never loads it), refuses what can be decided without a message (literal type clashes such as
``'a' = 1``, LIKE/ESCAPE shapes, length and nesting limits) and turns the tree into
nested closures ``fn(headers, message)``.  Evaluating a selector is then plain Python
calls -- no tree walking per message.  Compiled selectors are cached by text, because
many network consumers carry the same selector.

Semantics are SQL's three-valued logic: every closure returns True, False or None
(UNKNOWN).  A missing header is NULL.  An operator applied to NULL, or to operands of
the wrong *runtime* type (a string compared with a number, LIKE on a number, ordering
of strings, division by zero, overflow), gives UNKNOWN rather than an error: a message
must never be able to break a subscription.  A selector matches only when it is TRUE.
Arithmetic follows Java: int / int truncates toward zero.

JMS header identifiers (JMSPriority, JMSMessageID, JMSTimestamp in epoch milliseconds,
JMSDeliveryMode 'PERSISTENT' / 'NON_PERSISTENT', JMSType, JMSCorrelationID) are read
from ``message`` when one is given, otherwise from ``headers`` like any other name.

Invariants:
  * compile_selector raises only SelectorError (never RecursionError or lark errors).
  * evaluating a compiled selector never raises, whatever the header values are.
  * evaluation recursion is bounded by MAX_DEPTH: AND/OR/+/* chains are flat n-ary
    nodes, so a long but shallow selector stays shallow.
  * LIKE never backtracks: patterns are matched segment by segment between '%'.
Never: performs I/O, logs, or mutates the headers it reads.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import TYPE_CHECKING, Any, Callable

from treefed.errors import SelectorError

if TYPE_CHECKING:   # lark is imported by _parser(), at the first selector (issue #14)
    from lark import Lark, Token, Tree

__all__ = ["Selector", "compile_selector", "MAX_SELECTOR_LENGTH", "MAX_DEPTH"]

#: Longest selector text accepted (characters); keeps parse cost bounded per request.
MAX_SELECTOR_LENGTH = 4096
#: Deepest expression nesting accepted (parentheses, NOT, unary signs, operators).
MAX_DEPTH = 100

_GRAMMAR = r"""
?start: or_expr

?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr                                   -> not_
         | predicate
?predicate: sum _EQ sum                                    -> eq
          | sum _NE sum                                    -> ne
          | sum _LT sum                                    -> lt
          | sum _GT sum                                    -> gt
          | sum _LE sum                                    -> le
          | sum _GE sum                                    -> ge
          | sum _BETWEEN sum _AND sum                      -> between
          | sum _NOT _BETWEEN sum _AND sum                 -> not_between
          | sum _IN _LPAR STRING (_COMMA STRING)* _RPAR        -> in_
          | sum _NOT _IN _LPAR STRING (_COMMA STRING)* _RPAR   -> not_in
          | sum _LIKE STRING (_ESCAPE STRING)?             -> like
          | sum _NOT _LIKE STRING (_ESCAPE STRING)?        -> not_like
          | sum _IS _NULL                                  -> is_null
          | sum _IS _NOT _NULL                             -> is_not_null
          | sum
?sum: product ((PLUS | MINUS) product)*
?product: unary ((STAR | SLASH) unary)*
?unary: PLUS unary                                         -> pos
      | MINUS unary                                        -> neg
      | primary
?primary: _LPAR or_expr _RPAR                              -> paren
        | IDENT                                            -> ident
        | STRING                                           -> string
        | EXACT                                            -> exact
        | APPROX                                           -> approx
        | TRUE                                             -> true
        | FALSE                                            -> false

// Keywords outrank IDENT and need a non-identifier character after them, so
// "ANDY" is a name while "and" can never be one (basic lexer: no context tricks).
_OR.2: /or(?![\w$])/i
_AND.2: /and(?![\w$])/i
_NOT.2: /not(?![\w$])/i
_BETWEEN.2: /between(?![\w$])/i
_LIKE.2: /like(?![\w$])/i
_ESCAPE.2: /escape(?![\w$])/i
_IN.2: /in(?![\w$])/i
_IS.2: /is(?![\w$])/i
_NULL.2: /null(?![\w$])/i
TRUE.2: /true(?![\w$])/i
FALSE.2: /false(?![\w$])/i
IDENT: /(?:[^\W\d]|\$)[\w$]*/
STRING: /'(?:[^']|'')*'/
APPROX.2: /(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+/
EXACT.1: /\d+[lL]?/
_EQ: "="
_NE: "<>"
_LE: "<="
_GE: ">="
_LT: "<"
_GT: ">"
PLUS: "+"
MINUS: "-"
STAR: "*"
SLASH: "/"
_LPAR: "("
_RPAR: ")"
_COMMA: ","
%ignore /\s+/
"""



@functools.cache
def _parser() -> Lark:
    """The LALR parser, built once, on first use: importing lark and building the
    grammar costs ~6 MiB of RSS that a broker without selectors does not need."""
    from lark import Lark

    return Lark(_GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True)

# Static kinds: what a sub-expression can be known to yield before any message exists.
_BOOL, _NUM_K, _STR, _ANY = "boolean", "number", "string", "any"

_NUM = frozenset((int, float))                  # bool is deliberately not a number
_EQUATABLE = frozenset((int, float, str, bool))
_LONG_LIMIT = 2**63                             # JMS exact numerics are Java longs

_Fn = Callable[[dict, Any], Any]


class Selector:
    """A compiled selector. Immutable; shared between consumers with the same text."""

    __slots__ = ("text", "_fn")

    def __init__(self, text: str, fn: _Fn) -> None:
        self.text = text
        self._fn = fn

    def matches(self, headers: dict, *, message: Any = None) -> bool:
        """True only when the selector evaluates to TRUE (UNKNOWN does not match)."""
        return self._fn(headers, message) is True

    def evaluate(self, headers: dict, *, message: Any = None) -> bool | None:
        """The three-valued result: True, False, or None for UNKNOWN."""
        r = self._fn(headers, message)
        # A bare identifier selector yields the raw header value; only bools are truths.
        return r if r is True or r is False else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; raise SelectorError(reason, position=) if invalid."""
    if not isinstance(text, str):
        raise SelectorError(f"selector must be a string, not {type(text).__name__}")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(
            f"selector is longer than {MAX_SELECTOR_LENGTH} characters",
            position=MAX_SELECTOR_LENGTH,
        )
    return _compile_cached(text)


@functools.lru_cache(maxsize=1024)
def _compile_cached(text: str) -> Selector:
    # Failures are not cached (lru_cache does not memoise exceptions); they are bounded
    # by MAX_SELECTOR_LENGTH anyway.
    if not text.strip():
        raise SelectorError("empty selector", position=0)
    try:
        node = _build(_parse(text), 0)
    except RecursionError:
        raise SelectorError("selector is nested too deeply") from None
    if node.kind not in (_BOOL, _ANY):
        raise SelectorError(f"selector must be a boolean expression, not a {node.kind}",
                            position=_skip_space(text))
    return Selector(text, node.fn)


def _skip_space(text: str) -> int:
    return len(text) - len(text.lstrip())


# ----------------------------------------------------------------------------- parsing

_TOKEN_NAMES = {
    "_OR": "OR", "_AND": "AND", "_NOT": "NOT", "_BETWEEN": "BETWEEN", "_LIKE": "LIKE",
    "_ESCAPE": "ESCAPE", "_IN": "IN", "_IS": "IS", "_NULL": "NULL", "TRUE": "TRUE",
    "FALSE": "FALSE", "IDENT": "identifier", "STRING": "string literal",
    "EXACT": "number", "APPROX": "number", "_EQ": "'='", "_NE": "'<>'", "_LE": "'<='",
    "_GE": "'>='", "_LT": "'<'", "_GT": "'>'", "PLUS": "'+'", "MINUS": "'-'",
    "STAR": "'*'", "SLASH": "'/'", "_LPAR": "'('", "_RPAR": "')'", "_COMMA": "','",
    "$END": "end of selector",
}
# Every token that can start an operand; when all are acceptable, say "an expression".
_OPERAND_START = frozenset(("IDENT", "STRING", "EXACT", "APPROX", "TRUE", "FALSE", "_LPAR"))
# After a complete operand every binary operator is acceptable: say "an operator".
_OPERATORS = frozenset(("_EQ", "_NE", "_LT", "_GT", "_LE", "_GE", "PLUS", "MINUS", "STAR",
                        "SLASH", "_BETWEEN", "_IN", "_IS", "_LIKE", "_NOT"))
_KEYWORDS = frozenset(k for k, v in _TOKEN_NAMES.items() if v.isupper())


def _describe_expected(names: set[str]) -> str:
    groups = []
    if _OPERAND_START <= names:
        names = names - _OPERAND_START - {"PLUS", "MINUS", "_NOT"}
        groups.append("an expression")
    if _OPERATORS <= names:
        names = names - _OPERATORS
        groups.append("an operator")
    shown = groups + sorted({_TOKEN_NAMES.get(n, n) for n in names})
    if not shown:
        return "nothing more"
    if len(shown) == 1:
        return shown[0]
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def _describe_found(tok: Token) -> str:
    if tok.type == "$END":
        return "end of selector"
    if tok.type in _KEYWORDS:
        return f"keyword {tok.value.upper()}"
    if tok.type == "IDENT":
        return f"identifier {tok.value!r}"
    if tok.type == "STRING":
        return f"string literal {tok.value}"
    if tok.type in ("EXACT", "APPROX"):
        return f"number {tok.value}"
    return f"'{tok.value}'"


def _parse(text: str) -> Tree:
    parser = _parser()
    from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

    try:
        return parser.parse(text)
    except UnexpectedCharacters as e:
        pos = e.pos_in_stream
        ch = text[pos] if pos is not None and pos < len(text) else ""
        if ch == "'":
            raise SelectorError("unterminated string literal", position=pos) from None
        raise SelectorError(f"unexpected character {ch!r}", position=pos) from None
    except UnexpectedToken as e:
        tok = e.token
        # lark's end token borrows the last token's position; the user wants the end.
        pos = len(text) if tok.type == "$END" else tok.start_pos
        # ``accepts`` replays the parser per terminal: exact, unlike LALR's ``expected``.
        accepted = set(e.accepts or e.expected)
        reason = f"expected {_describe_expected(accepted)}, found {_describe_found(tok)}"
        raise SelectorError(reason, position=pos) from None
    except UnexpectedInput as e:  # other lark input errors: keep the message, translate
        raise SelectorError(str(e).splitlines()[0], position=e.pos_in_stream) from None
    except RecursionError:
        raise SelectorError("selector is nested too deeply") from None


# ------------------------------------------------------------------------ compilation


class _Node:
    """A compiled sub-expression: its closure, static kind, and constant value if any."""

    __slots__ = ("fn", "kind", "const", "value", "header")

    def __init__(self, fn: _Fn, kind: str, *, const: bool = False, value: Any = None,
                 header: str | None = None) -> None:
        self.fn = fn
        self.kind = kind
        self.const = const        # value known at compile time (no identifiers below)
        self.value = value
        self.header = header      # plain header name: lets comparisons read h.get directly


def _const(value: Any, kind: str | None = None) -> _Node:
    if kind is None or value is not None:
        kind = _kind_of(value)
    return _Node(lambda h, m: value, kind, const=True, value=value)


def _kind_of(value: Any) -> str:
    t = type(value)
    if t is bool:
        return _BOOL
    if t in _NUM:
        return _NUM_K
    if t is str:
        return _STR
    return _ANY


def _fold(fn: _Fn, kind: str, *kids: _Node) -> _Node:
    """Evaluate now when every operand is constant (no identifiers to wait for)."""
    if all(k.const for k in kids):
        return _const(fn({}, None), kind)
    return _Node(fn, kind)


def _pos(t: Tree | Token) -> int | None:
    from lark import Token   # loaded: ``t`` came from the parser

    if isinstance(t, Token):
        return t.start_pos
    return getattr(t.meta, "start_pos", None)


def _build(t: Tree | Token, depth: int) -> _Node:
    if depth > MAX_DEPTH:
        raise SelectorError(f"expression nested deeper than {MAX_DEPTH} levels",
                            position=_pos(t))
    return _HANDLERS[t.data](t, depth + 1)


def _require(node: _Node, kinds: tuple[str, ...], what: str, t: Tree | Token) -> None:
    if node.kind not in kinds:
        raise SelectorError(f"{what}; got a {node.kind}", position=_pos(t))


# literals and identifiers ------------------------------------------------------------


def _h_string(t: Tree, depth: int) -> _Node:
    return _const(_unquote(t.children[0]))


def _unquote(tok: Token) -> str:
    return tok.value[1:-1].replace("''", "'")


def _h_exact(t: Tree, depth: int) -> _Node:
    tok = t.children[0]
    digits = tok.value.rstrip("lL")
    # Reject before int() so a 4000-digit literal costs nothing (and never hits
    # Python's int-string conversion limit).
    if len(digits.lstrip("0")) > 19 or int(digits) > _LONG_LIMIT:
        raise SelectorError("exact numeric literal out of range", position=tok.start_pos)
    return _const(int(digits))


def _h_approx(t: Tree, depth: int) -> _Node:
    tok = t.children[0]
    value = float(tok.value)
    if value in (float("inf"), float("-inf")):
        raise SelectorError("approximate numeric literal out of range", position=tok.start_pos)
    return _const(value)


def _h_true(t: Tree, depth: int) -> _Node:
    return _const(True)


def _h_false(t: Tree, depth: int) -> _Node:
    return _const(False)


def _jms_timestamp(m: Any) -> int:
    return round(m.timestamp * 1000)   # JMS timestamps are epoch milliseconds


_JMS_HEADERS: dict[str, Callable[[Any], Any]] = {
    "JMSPriority": lambda m: m.priority,
    "JMSMessageID": lambda m: m.id,
    "JMSTimestamp": _jms_timestamp,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSType": lambda m: m.headers.get("JMSType"),
    "JMSCorrelationID": lambda m: m.headers.get("JMSCorrelationID"),
}


def _h_ident(t: Tree, depth: int) -> _Node:
    name = t.children[0].value
    getter = _JMS_HEADERS.get(name)
    if getter is not None:
        def jms(h, m):
            return h.get(name) if m is None else getter(m)
        return _Node(jms, _ANY)

    def header(h, m):
        return h.get(name)
    return _Node(header, _ANY, header=name)


def _h_paren(t: Tree, depth: int) -> _Node:
    return _build(t.children[0], depth)


# logic -------------------------------------------------------------------------------


def _logic_operands(t: Tree, depth: int, word: str) -> list[_Node]:
    kids = []
    for c in t.children:
        k = _build(c, depth)
        _require(k, (_BOOL, _ANY), f"{word} needs boolean operands", c)
        kids.append(k)
    return kids


def _h_and(t: Tree, depth: int) -> _Node:
    kids = _logic_operands(t, depth, "AND")
    fns = tuple(k.fn for k in kids)
    if len(fns) == 2:
        a, b = fns

        def and2(h, m):
            r = a(h, m)
            if r is False:
                return False
            s = b(h, m)
            if s is False:
                return False
            return True if r is True and s is True else None
        return _fold(and2, _BOOL, *kids)

    def and_n(h, m):
        unknown = False
        for f in fns:
            r = f(h, m)
            if r is False:
                return False
            if r is not True:
                unknown = True
        return None if unknown else True
    return _fold(and_n, _BOOL, *kids)


def _h_or(t: Tree, depth: int) -> _Node:
    kids = _logic_operands(t, depth, "OR")
    fns = tuple(k.fn for k in kids)
    if len(fns) == 2:
        a, b = fns

        def or2(h, m):
            r = a(h, m)
            if r is True:
                return True
            s = b(h, m)
            if s is True:
                return True
            return False if r is False and s is False else None
        return _fold(or2, _BOOL, *kids)

    def or_n(h, m):
        unknown = False
        for f in fns:
            r = f(h, m)
            if r is True:
                return True
            if r is not False:
                unknown = True
        return None if unknown else False
    return _fold(or_n, _BOOL, *kids)


def _h_not(t: Tree, depth: int) -> _Node:
    (kid,) = _logic_operands(t, depth, "NOT")
    f = kid.fn

    def not_(h, m):
        r = f(h, m)
        return False if r is True else (True if r is False else None)
    return _fold(not_, _BOOL, kid)


# comparisons -------------------------------------------------------------------------

_CMP = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "gt": operator.gt,
        "le": operator.le, "ge": operator.ge}
_CMP_TEXT = {"eq": "=", "ne": "<>", "lt": "<", "gt": ">", "le": "<=", "ge": ">="}
_FLIP = {"eq": "eq", "ne": "ne", "lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}


def _h_compare(t: Tree, depth: int) -> _Node:
    name = t.data
    a, b = (_build(c, depth) for c in t.children)
    ordering = name not in ("eq", "ne")
    if ordering:
        what = f"'{_CMP_TEXT[name]}' needs numbers (strings and booleans allow only = and <>)"
        for k, c in ((a, t.children[0]), (b, t.children[1])):
            _require(k, (_NUM_K, _ANY), what, c)
    elif _ANY not in (a.kind, b.kind) and a.kind != b.kind:
        raise SelectorError(f"a {a.kind} can never equal a {b.kind}", position=_pos(t))

    if a.const and b.header is not None:  # literal on the left: read it the other way
        a, b, name = b, a, _FLIP[name]
    op = _CMP[name]
    if a.header is not None and b.const and b.value is not None:
        key, c = a.header, b.value
        allowed = _NUM if type(c) in _NUM else frozenset((type(c),))

        def cmp_header(h, m):
            v = h.get(key)
            return op(v, c) if type(v) in allowed else None
        return _Node(cmp_header, _BOOL)

    fa, fb = a.fn, b.fn
    if ordering:
        def cmp_order(h, m):
            x = fa(h, m)
            y = fb(h, m)
            return op(x, y) if type(x) in _NUM and type(y) in _NUM else None
        return _fold(cmp_order, _BOOL, a, b)

    def cmp_equal(h, m):
        x = fa(h, m)
        y = fb(h, m)
        tx = type(x)
        if tx is type(y):
            return op(x, y) if tx in _EQUATABLE else None
        return op(x, y) if tx in _NUM and type(y) in _NUM else None
    return _fold(cmp_equal, _BOOL, a, b)


def _h_between(t: Tree, depth: int) -> _Node:
    negate = t.data == "not_between"
    v, lo, hi = kids = [_build(c, depth) for c in t.children]
    for k, c in zip(kids, t.children):
        _require(k, (_NUM_K, _ANY), "BETWEEN compares numbers", c)

    if v.header is not None and lo.const and hi.const \
            and lo.value is not None and hi.value is not None:
        key, low, high = v.header, lo.value, hi.value

        def between_const(h, m):
            x = h.get(key)
            if type(x) not in _NUM:
                return None
            return (not low <= x <= high) if negate else low <= x <= high
        return _Node(between_const, _BOOL)

    fv, fl, fh = v.fn, lo.fn, hi.fn

    def between(h, m):
        x = fv(h, m)
        if type(x) not in _NUM:
            return None
        y = fl(h, m)
        z = fh(h, m)
        # SQL: x BETWEEN y AND z  ==  x >= y AND x <= z, in three-valued logic.
        r1 = x >= y if type(y) in _NUM else None
        r2 = x <= z if type(z) in _NUM else None
        if r1 is False or r2 is False:
            r = False
        elif r1 is None or r2 is None:
            return None
        else:
            r = True
        return not r if negate else r
    return _fold(between, _BOOL, *kids)


def _h_in(t: Tree, depth: int) -> _Node:
    negate = t.data == "not_in"
    v = _build(t.children[0], depth)
    _require(v, (_STR, _ANY), "IN applies to strings", t.children[0])
    values = frozenset(_unquote(tok) for tok in t.children[1:])
    f, key = v.fn, v.header

    if key is not None:
        def in_header(h, m):
            x = h.get(key)
            if type(x) is not str:
                return None
            return (x not in values) if negate else (x in values)
        return _Node(in_header, _BOOL)

    def in_(h, m):
        x = f(h, m)
        if type(x) is not str:
            return None
        return (x not in values) if negate else (x in values)
    return _fold(in_, _BOOL, v)


def _h_like(t: Tree, depth: int) -> _Node:
    negate = t.data == "not_like"
    v = _build(t.children[0], depth)
    _require(v, (_STR, _ANY), "LIKE applies to strings", t.children[0])
    pattern_tok = t.children[1]
    escape = None
    if len(t.children) == 3:
        esc_tok = t.children[2]
        escape = _unquote(esc_tok)
        if len(escape) != 1:
            raise SelectorError("ESCAPE must be exactly one character",
                                position=esc_tok.start_pos)
    match = _like_matcher(_unquote(pattern_tok), escape, pattern_tok.start_pos)
    f = v.fn

    def like(h, m):
        x = f(h, m)
        if type(x) is not str:
            return None
        return (not match(x)) if negate else match(x)
    return _fold(like, _BOOL, v)


def _like_matcher(pattern: str, escape: str | None, pos: int) -> Callable[[str], bool]:
    """Compile a LIKE pattern into a non-backtracking matcher.

    The pattern is split at unescaped '%' into fixed-length segments ('_' = any one
    character).  The first segment is anchored at the start, the last at the end, and
    each middle segment is placed at its leftmost fit -- which is optimal, so the
    whole match is one left-to-right scan instead of a backtracking regex that a
    hostile '%a%a%a%a%b' could make exponential.
    """
    segments: list[list[str]] = [[]]      # each: regex pieces of one segment
    wild = [False]                        # does the segment contain '_'
    literal: list[str] = [""]             # the segment's text when it has no '_'
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == escape:
            i += 1
            if i == n:
                raise SelectorError("LIKE pattern ends with its ESCAPE character",
                                    position=pos)
            c = pattern[i]
            segments[-1].append(re.escape(c))
            literal[-1] += c
        elif c == "%":
            segments.append([])
            wild.append(False)
            literal.append("")
        elif c == "_":
            segments[-1].append(".")
            wild[-1] = True
        else:
            segments[-1].append(re.escape(c))
            literal[-1] += c
        i += 1

    # A segment is either a plain string (str methods: linear time) or a fixed-width
    # regex; both expose "matches at i" and "find first end at or after i".
    parts = [re.compile("".join(s), re.DOTALL) if w else lit
             for s, w, lit in zip(segments, wild, literal)]
    widths = [len(s) for s in segments]

    if len(parts) == 1:
        only = parts[0]
        if isinstance(only, str):
            return only.__eq__
        return lambda s: only.fullmatch(s) is not None

    first, last, middle = parts[0], parts[-1], list(zip(parts[1:-1], widths[1:-1]))
    w_first, w_last = widths[0], widths[-1]
    min_len = sum(widths)

    def match(s: str) -> bool:
        if len(s) < min_len:
            return False
        end = len(s) - w_last
        if not _seg_at(first, s, 0) or not _seg_at(last, s, end):
            return False
        at = w_first
        for seg, width in middle:
            if not width:
                continue
            if isinstance(seg, str):
                k = s.find(seg, at, end)
                if k < 0:
                    return False
                at = k + width
            else:
                found = seg.search(s, at, end)
                if found is None:
                    return False
                at = found.end()
        return True
    return match


def _seg_at(seg: str | re.Pattern, s: str, i: int) -> bool:
    if isinstance(seg, str):
        return s.startswith(seg, i)
    return seg.match(s, i) is not None


def _h_is_null(t: Tree, depth: int) -> _Node:
    negate = t.data == "is_not_null"
    v = _build(t.children[0], depth)
    f, key = v.fn, v.header
    if key is not None:
        if negate:
            return _Node(lambda h, m: h.get(key) is not None, _BOOL)
        return _Node(lambda h, m: h.get(key) is None, _BOOL)
    if negate:
        return _fold(lambda h, m: f(h, m) is not None, _BOOL, v)
    return _fold(lambda h, m: f(h, m) is None, _BOOL, v)


# arithmetic --------------------------------------------------------------------------


def _java_div(x: int | float, y: int | float) -> int | float:
    if type(x) is int and type(y) is int:
        q = abs(x) // abs(y)               # ZeroDivisionError -> UNKNOWN in the caller
        return q if (x < 0) == (y < 0) else -q
    return x / y


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": _java_div}


def _h_arith(t: Tree, depth: int) -> _Node:
    # Children alternate operand, operator token, operand...: one flat n-ary node.
    kids = [_build(c, depth) for c in t.children[::2]]
    for k, c in zip(kids, t.children[::2]):
        _require(k, (_NUM_K, _ANY), f"'{t.children[1].value}' needs numeric operands", c)
    ops = [_ARITH[tok.value] for tok in t.children[1::2]]

    if len(kids) == 2:
        fa, fb, op = kids[0].fn, kids[1].fn, ops[0]

        def arith2(h, m):
            x = fa(h, m)
            y = fb(h, m)
            if type(x) in _NUM and type(y) in _NUM:
                try:
                    return op(x, y)
                except ArithmeticError:     # division by zero, int too large for float
                    return None
            return None
        return _fold(arith2, _NUM_K, *kids)

    first = kids[0].fn
    rest = tuple(zip(ops, (k.fn for k in kids[1:])))

    def arith_n(h, m):
        x = first(h, m)
        for op, g in rest:
            if type(x) not in _NUM:
                return None
            y = g(h, m)
            if type(y) not in _NUM:
                return None
            try:
                x = op(x, y)
            except ArithmeticError:
                return None
        return x
    return _fold(arith_n, _NUM_K, *kids)


def _h_sign(t: Tree, depth: int) -> _Node:
    negate = t.data == "neg"
    kid = _build(t.children[-1], depth)
    _require(kid, (_NUM_K, _ANY), "unary sign needs a numeric operand", t.children[-1])
    f = kid.fn
    if negate:
        def neg(h, m):
            x = f(h, m)
            return -x if type(x) in _NUM else None
        return _fold(neg, _NUM_K, kid)

    def pos(h, m):
        x = f(h, m)
        return x if type(x) in _NUM else None
    return _fold(pos, _NUM_K, kid)


_HANDLERS: dict[str, Callable[[Tree, int], _Node]] = {
    "or_expr": _h_or, "and_expr": _h_and, "not_": _h_not,
    "eq": _h_compare, "ne": _h_compare, "lt": _h_compare, "gt": _h_compare,
    "le": _h_compare, "ge": _h_compare,
    "between": _h_between, "not_between": _h_between,
    "in_": _h_in, "not_in": _h_in, "like": _h_like, "not_like": _h_like,
    "is_null": _h_is_null, "is_not_null": _h_is_null,
    "sum": _h_arith, "product": _h_arith, "pos": _h_sign, "neg": _h_sign,
    "paren": _h_paren, "ident": _h_ident, "string": _h_string, "exact": _h_exact,
    "approx": _h_approx, "true": _h_true, "false": _h_false,
}
