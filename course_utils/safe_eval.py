"""A restricted evaluator for the `{{ ... }}` placeholders of the course's texts (course_utils.facts).

A placeholder is an expression over the facts namespace, and nothing else: names from that namespace (and
the loop names of a generator expression), attribute access (no name that starts with '_'), calls of the
namespace's functions and of the public methods of what they return, literals, arithmetic (an exponent of at
most MAX_EXPONENT, a repetition of at most MAX_REPEAT items), comparisons, `and`/`or`/`not`, `x if c else y`,
subscripts, tuples/lists and one-`for` generator expressions. It runs against a deadline (SECONDS), checked
at every step of the evaluation. `{{ 9**9**9 }}` or `{{ ().__class__ }}` is refused at once with the reason,
where eval() would hang or hand out the interpreter.
"""

from __future__ import annotations

import ast
import operator
import time
from typing import Any

MAX_EXPONENT = 64  # 2**64 and 1.5**64 are figures; 9**9**9 is a hang
MAX_REPEAT = 10_000  # 'x' * n and [0] * n
SECONDS = 10.0  # a placeholder that takes longer is stopped (the namespace's own functions are not interrupted)


class UnsafeExpression(ValueError):
    """A placeholder that the restricted evaluator refuses or stops; the message says why."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}


def evaluate(expression: str, names: dict[str, Any], seconds: float = SECONDS) -> Any:
    """The value of `expression` with `names` as its only names; UnsafeExpression for anything outside the
    restricted language, past the deadline, or too big; the expression's own errors (a KeyError of a label
    that is not there, a ZeroDivisionError) as they are."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise UnsafeExpression(f"not an expression ({exc.msg})") from None
    return _Evaluator(names, time.monotonic() + seconds, seconds).run(tree.body)


class _Evaluator:
    def __init__(self, names: dict[str, Any], deadline: float, seconds: float):
        self.names, self.deadline, self.seconds = dict(names), deadline, seconds

    def run(self, node: ast.AST) -> Any:
        if time.monotonic() > self.deadline:
            raise UnsafeExpression(f"took longer than {self.seconds:g} s; stopped")
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise UnsafeExpression(f"{type(node).__name__} ({ast.unparse(node)!r}) is not allowed in a placeholder")
        return method(node)

    # --- leaves --------------------------------------------------------------------------------------------
    def _Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise UnsafeExpression(f"unknown name {node.id!r} (the names are those of course_utils.chapter.facts.namespace())")
        return self.names[node.id]

    def _Attribute(self, node: ast.Attribute) -> Any:
        if node.attr.startswith("_"):
            raise UnsafeExpression(f"attribute {node.attr!r}: names that start with '_' are not allowed")
        obj = self.run(node.value)
        if isinstance(obj, (str, bytes)) and node.attr in ("format", "format_map"):  # '{0.__class__}'.format(x)
            raise UnsafeExpression(f"str.{node.attr} is not allowed (a format spec after ':' formats a figure)")
        return getattr(obj, node.attr)

    # --- operators -----------------------------------------------------------------------------------------
    def _BinOp(self, node: ast.BinOp) -> Any:
        op = _BINARY.get(type(node.op))
        if op is None:
            raise UnsafeExpression(f"operator {type(node.op).__name__} is not allowed")
        left, right = self.run(node.left), self.run(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
            raise UnsafeExpression(f"exponent {right!r} is above {MAX_EXPONENT}")
        if isinstance(node.op, ast.Mult):
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and n * max(1, len(seq)) > MAX_REPEAT:
                    raise UnsafeExpression(f"a repetition of {n} x {len(seq)} items is above {MAX_REPEAT}")
        return op(left, right)

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        op = _UNARY.get(type(node.op))
        if op is None:
            raise UnsafeExpression(f"operator {type(node.op).__name__} is not allowed")
        return op(self.run(node.operand))

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        value = None
        for item in node.values:
            value = self.run(item)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.run(node.left)
        for op, item in zip(node.ops, node.comparators):
            right = self.run(item)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.run(node.body) if self.run(node.test) else self.run(node.orelse)

    # --- calls and containers --------------------------------------------------------------------------------
    def _Call(self, node: ast.Call) -> Any:
        func = self.run(node.func)
        if isinstance(func, type) and func.__module__ == "builtins":
            raise UnsafeExpression(f"calling {func.__name__} is not allowed")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise UnsafeExpression("*arguments are not allowed")
            args.append(self.run(a))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                raise UnsafeExpression("**arguments are not allowed")
            kwargs[k.arg] = self.run(k.value)
        return func(*args, **kwargs)

    def _Subscript(self, node: ast.Subscript) -> Any:
        return self.run(node.value)[self.run(node.slice)]

    def _Slice(self, node: ast.Slice) -> Any:
        part = lambda n: None if n is None else self.run(n)  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def _Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self.run(e) for e in node.elts)

    def _List(self, node: ast.List) -> Any:
        return [self.run(e) for e in node.elts]

    def _GeneratorExp(self, node: ast.GeneratorExp) -> Any:
        if len(node.generators) != 1 or not isinstance(node.generators[0].target, ast.Name) or node.generators[0].is_async:
            raise UnsafeExpression("a generator expression may have one `for NAME in ...` (and `if`s)")
        gen = node.generators[0]
        name, items, before = gen.target.id, self.run(gen.iter), self.names.get(gen.target.id, _MISSING)
        out = []
        try:
            for item in items:
                self.names[name] = item
                if all(self.run(cond) for cond in gen.ifs):
                    out.append(self.run(node.elt))
        finally:
            if before is _MISSING:
                self.names.pop(name, None)
            else:
                self.names[name] = before
        return iter(out)

    _ListComp = None  # not allowed: only the generator form the texts use


_MISSING = object()
