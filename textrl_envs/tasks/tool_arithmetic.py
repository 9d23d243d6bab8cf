"""``ToolArithmetic-v0``: products past what the LM knows by heart, with a calculator it may call."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import TOOL_ARITHMETIC


class ToolArithmeticEnv(TextGenEnv):
    """Compute ``37*12`` with the help of a calculator tool, then give the answer.

    Tool use as a Gymnasium env: a call is text the agent writes, the tool's result is text the environment
    writes back, and the reward comes only from the final answer.

    ## Description
    Prompts are ``"Compute a*b."`` with ``a`` in 13-99 and ``b`` in 3-19 (269 distinct problems, 300 draws with
    seed 0, :func:`textrl_envs.tasks.tool_arithmetic_prompts`), past the one- and two-digit facts the bundled
    LM learned. A turn ends at EOS. A turn that starts with ``calc`` is a call, ``calc: 37*12`` (two integers
    and one of ``+ - *``): the environment appends ``" = 444."``; a call that does not parse gets
    ``" error: write calc: a*b."``. Any other turn is the final answer
    (:class:`~textrl_envs.tasks.interactions.Calculator`).

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the agent's next token (the environment's replies are written into
    the observation, never acted).

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``12 + 48 = 60``): the prompt, then the conversation,
    right-aligned, pad on the left with mask 0.

    ## Rewards
    On the final answer's step: 1.0 when its text, stripped, is exactly the product (``" 444"``), else 0.0.
    Calls pay 0.

    ## Starting State
    A problem drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})`` picks one and
    ``options={"prompt": "Compute 21*4."}`` poses another (its answer is computed from the text).

    ## Episode End
    Terminated at the final answer; truncated after ``max_turns = 3`` turns (calls included) or when
    ``max_new_tokens = 48`` tokens after the prompt are spent; a turn also ends after ``max_turn_tokens = 12``
    tokens. The final ``info`` holds ``prompt``, ``completion`` (the conversation after the prompt),
    ``completion_ids``, ``prompt_index``, ``reward``, ``turns`` and ``transcript``.

    ## Arguments
    ``gym.make("ToolArithmetic-v0", max_turns=3, max_turn_tokens=12, turn_end=None, max_new_tokens=48,
    max_prompt_tokens=12, prompts=None, tokenizer=None, interaction=None, reward=None, reward_timeout=600.0,
    render_mode=None)``. Own prompts: ``{"prompt": "Compute 12*34.", "answer": "408"}``.

    ``instruct=True`` (an instruct model, e.g. ``tokenizer="smollm2-135m-instruct"``; :mod:`textrl_envs.instruct`)
    asks the problem in a chat with the calculator explained; a turn with a line ``calc: a*b`` (and no ``Answer:``)
    is a call, answered ``"calc: a*b = <value>"`` as a user message; any other turn is the final answer, read from
    free text and compared as a number (:class:`~textrl_envs.tasks.interactions.Calculator` with ``chat=True``).
    Budgets: 3 turns of up to 48 tokens, ``max_new_tokens=192``, ``max_prompt_tokens=128``.

    ## Vectorized environment
    ``gym.make_vec("ToolArithmetic-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv` (equal to ``SyncVectorEnv`` over ``gym.make`` envs);
    ``group_size=G`` gives G attempts at each problem.

    ## Version History
    * v0: Initial version.
    """

    default_task = TOOL_ARITHMETIC.env_id
