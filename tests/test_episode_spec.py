"""``EpisodeSpec`` and ``build_spec``: the dataclass declares its fields in one block, and the budgets an env
gets without a task are the defaults :class:`~textrl_envs.tasks.Task` declares."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from textrl_envs.core import EpisodeSpec, build_spec
from textrl_envs.tasks import Task


def test_episode_spec_declares_every_field_before_its_methods():
    tree = ast.parse(textwrap.dedent(inspect.getsource(EpisodeSpec)))
    body = tree.body[0].body
    kinds = ["field" if isinstance(node, ast.AnnAssign) else "method" for node in body
             if isinstance(node, ast.AnnAssign | ast.FunctionDef)]  # fmt: skip
    assert "field" in kinds and "method" in kinds
    first_method = kinds.index("method")
    assert "field" not in kinds[first_method:], "a dataclass field is declared among the methods of EpisodeSpec"
    assert [f.name for f in dataclasses.fields(EpisodeSpec)][-1] == "reset_messages"


@pytest.mark.parametrize(("name", "value"), [("max_new_tokens", 7), ("max_prompt_tokens", 9)])
def test_budgets_without_a_task_are_the_task_defaults(monkeypatch, name, value):
    field = next(f for f in dataclasses.fields(Task) if f.name == name)
    spec = build_spec(prompts=["a prompt"], reward=lambda completions, **kw: [0.0] * len(completions))
    assert getattr(spec, name) == field.default
    monkeypatch.setattr(field, "default", value)  # the one place the default is stated
    spec = build_spec(prompts=["a prompt"], reward=lambda completions, **kw: [0.0] * len(completions))
    assert getattr(spec, name) == value
