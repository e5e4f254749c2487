"""The `calculator` tool: arithmetic on ints and floats, parsed with `ast`, never `eval`.

Only a number, `+ - * / // % **`, unary `+`/`-` and parentheses are accepted; any other
syntax (names, calls, attributes, subscripts, strings, comparisons) is rejected before
anything is computed. The expression comes from a model, so it is treated as hostile:
its length is capped, and a power is refused before it is computed when its result would be
too big, since `9**9**9` alone would hold a worker for minutes.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool

from worker.tools.progress import get_reporter

__all__ = [
    "MAX_EXPONENT",
    "MAX_EXPRESSION_CHARS",
    "MAX_RESULT_BITS",
    "CalculatorError",
    "calculator",
    "evaluate",
    "format_number",
]

MAX_EXPRESSION_CHARS = 256
MAX_EXPONENT = 10_000
# About 3,000 decimal digits: far more than any answer needs, far below what is slow, and
# under Python's 4,300-digit limit on int-to-str conversion.
MAX_RESULT_BITS = 10_000

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


class CalculatorError(ValueError):
    """The expression is not allowed, or its value cannot be computed."""


def evaluate(expression: str) -> Number:
    """The value of an arithmetic `expression`; raises `CalculatorError` with a clear reason."""
    _check_size(expression)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalculatorError(f"not a valid arithmetic expression: {expression!r}") from exc
    except RecursionError as exc:
        raise CalculatorError("expression nested too deeply") from exc
    try:
        value = _eval(tree.body)
    except ZeroDivisionError as exc:
        raise CalculatorError("division by zero") from exc
    except OverflowError as exc:
        raise CalculatorError("result too large") from exc
    except RecursionError as exc:
        raise CalculatorError("expression nested too deeply") from exc
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result too large")
    return value


def _check_size(expression: str) -> None:
    """Raise `CalculatorError` for an empty expression or one longer than allowed."""
    if not expression.strip():
        raise CalculatorError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")


def format_number(value: Number) -> str:
    """A number as the model should read it: ints exact, floats without binary noise."""
    if isinstance(value, int):
        return str(value)
    # 15 significant digits hides float noise: 0.1 + 0.2 reads "0.3", not 0.30000000000000004.
    return f"{value:.15g}"


@tool
def calculator(expression: str, config: RunnableConfig) -> str:
    """Evaluate an arithmetic expression and return its value.

    Supports numbers, + - * / // % ** (power), unary minus and parentheses,
    for example "(2 + 3) * 4 ** 2 / 7". No variables or functions.
    """
    reporter = get_reporter(config)
    try:
        # Checked before the expression goes into a progress message: a model can send a
        # megabyte of it, and every progress message is streamed to the client.
        _check_size(expression)
        reporter.step(f"Evaluating {expression}")
        result = format_number(evaluate(expression))
    except CalculatorError as exc:
        reporter.error(str(exc))
        raise ToolException(f"Error: {exc}") from exc
    reporter.complete(f"{expression} = {result}")
    return result


# The model reads the error text as the tool's result and can correct its expression.
calculator.handle_tool_error = True


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass, but True + True is not arithmetic the model meant.
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        raise CalculatorError(f"unsupported value {node.value!r}: only numbers are allowed")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) in _BINARY:
            return _checked(_BINARY[type(node.op)](left, right))
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("'^' is not supported; use '**' for powers")
    raise CalculatorError(f"unsupported syntax: {_describe(node)}")


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
    # Checked before computing: an int power has about exponent * bits(base) bits.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent * (abs(base).bit_length() - 1) > MAX_RESULT_BITS
    ):
        raise CalculatorError("result too large")
    result = base**exponent
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number")
    return _checked(result)


def _checked(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise CalculatorError("result too large")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Call):
        return "function call"
    if isinstance(node, ast.Attribute):
        return f"attribute {node.attr!r}"
    if isinstance(node, ast.BinOp | ast.UnaryOp | ast.BoolOp | ast.Compare):
        op = getattr(node, "op", None) or getattr(node, "ops", [None])[0]
        return f"operator {type(op).__name__}"
    return type(node).__name__
