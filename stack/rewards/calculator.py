"""The built-in `calculator` environment (env=calculator): the addition task with a tool.

A model turn that ends in `calc(EXPR)` (EXPR: integers with + - * and parentheses) is answered
with " = VALUE\n", and the model goes on; a turn without a call ends the trajectory, rewarded
1.0 when its final number is the record's `answer` (the rule of stack.rewards.functions.accuracy),
else 0.0. The reward reads the model's last turn only, so copying the tool's output is what
earns it. A call that is not arithmetic is answered " = error\n".
"""

import ast
import operator
import re
from typing import Any, ClassVar

from stack.rewards.environment import Step
from stack.rewards.functions import accuracy

CALL = re.compile(r"calc\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*$")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(text: str) -> int:
    """The value of an integer expression of + - * and parentheses; ValueError for anything else."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not arithmetic: {text!r}")

    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as why:
        raise ValueError(f"not arithmetic: {text!r}") from why
    if len(text) > 64:
        raise ValueError("expression too long")
    return value(tree.body)


class Calculator:
    """One trajectory of the addition task with `calc(...)` (see the module docstring)."""

    stops: ClassVar[tuple[str, ...]] = (")",)

    def __init__(self) -> None:
        self.answer: Any = None

    def reset(self, record: dict[str, Any]) -> None:
        self.answer = record.get("answer")

    def step(self, completion: str) -> Step:
        call = CALL.search(completion)
        if call is None:
            return Step(reward=accuracy([""], [completion], [self.answer])[0], done=True)
        try:
            return Step(f" = {evaluate(call.group(1))}\n")
        except ValueError:
            return Step(" = error\n")
