"""``ToolUse-v0``: Python tools described by JSON schema through the chat template, called in the model's own format."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import TOOL_USE


class ToolUseEnv(TextGenEnv):
    """Compute ``37*12+45`` by calling the tools ``multiply`` and ``add``, then give the answer.

    Tool calling as TRL's ``GRPOTrainer(tools=...)`` does it, as a Gymnasium env: the tools are Python functions,
    described to the model through the chat template's ``tools=`` argument with the JSON schema of each function's
    signature and docstring (transformers' ``get_json_schema``); the model calls them in its family's format; each
    result comes back as a ``tool`` message rendered by the template; the reward reads the whole transcript.

    ## Description
    Prompts are ``"Compute a*b+c."`` with ``a`` in 13-99, ``b`` in 3-19 and ``c`` in 2-99 (300 seeded draws,
    :func:`textrl_envs.tasks.tool_use_prompts`) and two tools, ``multiply(a, b)`` and ``add(a, b)``
    (:mod:`textrl_envs.tools.builtin`). The prompt is rendered with the tokenizer's chat template and the tools: a
    template that renders ``tools=`` (Qwen2.5's) describes them itself; for one that does not (SmolLM2's) the
    description goes into the system message in the family's format; a tokenizer without a template (the bundled
    one) gets :data:`~textrl_envs.tools.rendering.FALLBACK_TEMPLATE`, one line of signatures. The call format follows
    the template (:func:`~textrl_envs.tools.formats.detect_format`): Hermes / Qwen's
    ``<tool_call>{"name": "multiply", "arguments": {"a": 37, "b": 12}}</tool_call>``, or SmolLM2's JSON list in one
    tag. An agent turn ends at the template's end-of-turn token. A turn with calls is answered (each call checked
    and run with a 5 s timeout, :class:`~textrl_envs.tools.ToolCalling`): its results as ``tool`` messages and the
    next assistant header, as the template renders them. A malformed call, an unknown tool, arguments of the wrong
    type, a tool that raises or hangs are each answered ``error: ...``: the model reads what went wrong. The first
    turn without a call is the answer.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the agent's next token (the tool messages are written into the
    observation, never acted).

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``48 + 80 = 128``, the bundled LM's context): the rendered
    prompt, then the conversation, right-aligned, pad on the left with mask 0. A chat model with the tools'
    JSON schemas in its system message needs a larger ``max_prompt_tokens`` (about 300 for SmolLM2's).

    ## Rewards
    At the episode's end, the env's reward scores the transcript, called as TRL calls reward functions: with chat
    prompts its completion is the conversation's messages (assistant turns with their ``tool_calls``, ``tool``
    messages). The default, ``"final-answer"`` (:class:`~textrl_envs.rewards.answers.FinalAnswerReward`): 1.0 when
    the final answer of the last assistant turn without a call (:func:`~textrl_envs.rewards.answers.final_answer`)
    equals the prompt's ``answer`` as a number, else 0.0. Tool turns
    pay 0.

    ## Starting State
    A problem drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})`` picks one.

    ## Episode End
    Terminated at the answer; truncated after ``max_turns = 4`` turns (calls included) or when ``max_new_tokens =
    80`` tokens after the prompt are spent; a turn also ends after ``max_turn_tokens = 64`` tokens. The final
    ``info`` holds ``prompt``, ``completion`` (the conversation after the prompt), ``completion_ids``,
    ``prompt_index``, ``reward``, ``turns``, ``transcript``, ``tool_calls`` (calls answered) and ``tool_errors``
    (those that went wrong).

    ## Arguments
    ``gym.make("ToolUse-v0", tools=None, prompts=None, reward=None, tokenizer=None, chat_template=None,
    max_turns=4, max_turn_tokens=64, turn_end=None, max_new_tokens=80, max_prompt_tokens=48, reward_timeout=None,
    render_mode=None)``. ``tools=[f, g]`` replaces the tools (give prompts and a reward for them); a tool is a function
    with type hints and an ``Args:`` docstring. ``interaction=ToolCalling(tools, timeout=..., tool_format=...)``
    sets the call timeout and format. Any other text id takes ``tools=`` too.

    ## Vectorized environment
    ``gym.make_vec("ToolUse-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv` (equal to ``SyncVectorEnv`` over ``gym.make`` envs); each turn is an
    agent turn, so ``advantage="group_turn"`` credits calls and the answer separately.

    ## Version History
    * v0: Initial version.
    """

    default_task = TOOL_USE.env_id
