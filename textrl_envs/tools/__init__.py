"""Tools by schema: Python functions a model calls in its family's format, described through the chat template.

* :mod:`~textrl_envs.tools.schema`: a tool's JSON schema (transformers' ``get_json_schema``), and the check of a call's
  arguments against it;
* :mod:`~textrl_envs.tools.formats`: the Hermes / Qwen and SmolLM2 call formats, chosen from the chat template;
* :mod:`~textrl_envs.tools.running`: one call checked and run with a timeout, every failure an outcome;
* :mod:`~textrl_envs.tools.rendering`: the prompt with the tools and the ``tool`` messages, as the template renders
  them;
* :mod:`~textrl_envs.tools.interaction`: :class:`ToolCalling`, the :class:`~textrl_envs.interaction.Interaction` of a
  tool episode (``gym.make(id, tools=[...])`` builds one);
* :mod:`~textrl_envs.tools.builtin`: the tools of ``ToolUse-v0``.

Importing this package imports neither transformers nor torch; binding a :class:`ToolCalling` to an env does.
"""

from textrl_envs.tools.formats import FORMATS, ToolCall, ToolCallFormat, detect_format
from textrl_envs.tools.interaction import ToolCalling
from textrl_envs.tools.running import OUTCOMES, ToolOutcome, run_call
from textrl_envs.tools.schema import argument_errors, tool_schemas

__all__ = [
    "FORMATS",
    "OUTCOMES",
    "ToolCall",
    "ToolCallFormat",
    "ToolCalling",
    "ToolOutcome",
    "argument_errors",
    "detect_format",
    "run_call",
    "tool_schemas",
]
