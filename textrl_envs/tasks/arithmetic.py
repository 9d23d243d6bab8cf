"""``Arithmetic-v0``: answer small arithmetic problems (a verifiable reward with partial credit)."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import ARITHMETIC


class ArithmeticEnv(TextGenEnv):
    """Verifiable answers: complete ``"12+7="`` with ``"19"``.

    The home ground of group-relative GRPO: a cheap verifier gives the reward, and partial credit
    makes near misses better than nonsense.

    ## Description
    Prompts are problems ``"a+b="``, ``"a-b="`` (``a, b`` in 0-20, differences may be negative) and
    ``"a*b="`` (``a, b`` in 0-12), a fixed list of about 250 distinct problems (300 draws) drawn with seed 0
    (:func:`textrl_envs.tasks.arithmetic_prompts`). The agent writes the answer, digit by digit (the bundled tokenizer
    has one token per digit), then EOS.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``8 + 4 = 12``), right-aligned, pad on the
    left with mask 0.

    ## Rewards
    0 on every step but the last. At the end (:class:`~textrl_envs.rewards.ArithmeticReward`), with
    ``s = completion.strip()`` and ``ans`` the answer: 1.0 if ``s`` is an integer equal to ``ans``;
    else 0.0 if ``s`` holds no integer; else, with ``pred`` its first integer,
    ``0.1 * [s is exactly one integer] + 0.5 * max(0, 1 - |pred - ans| / (|ans| + 1))``.
    Range ``[0, 1]``. ``reward="exact-match"`` gives the plain 0/1 verifier.

    ## Starting State
    A problem drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})``
    picks one. A problem given as text (``options={"prompt": "3+4="}``) is scored against the value
    the reward computes from it.

    ## Episode End
    Terminated when the agent emits EOS; truncated after ``max_new_tokens = 4`` tokens (enough for
    ``-20`` or ``144`` and EOS). The final ``info`` holds ``prompt``, ``completion``,
    ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    ``gym.make("Arithmetic-v0", prompts=None, reward=None, reward_kwargs=None, tokenizer=None,
    max_new_tokens=4, max_prompt_tokens=8, prompt_truncation="left", render_mode=None)``. Own
    prompts are dicts ``{"prompt": "2+2=", "answer": "4"}`` (plain strings of the form ``"a+b="``
    also work: the reward computes their answer). ``reward_kwargs={"partial_weight": 0,
    "format_weight": 0}`` switches partial credit off.

    ``instruct=True`` (an instruct model, e.g. ``tokenizer="smollm2-135m-instruct"``; :mod:`textrl_envs.instruct`)
    asks ``"What is 12 + 7?"`` and the answer format in a chat, and scores 1 when the final answer of the free-text
    reply equals the answer by Math-Verify (:class:`~textrl_envs.rewards.answers.FinalAnswerReward`, the ``math``
    extra), 0 otherwise; budgets ``max_new_tokens=64``, ``max_prompt_tokens=96``.

    ## Vectorized environment
    ``gym.make_vec("Arithmetic-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`; ``group_size=G`` gives G attempts per problem, as
    group-relative advantages need.

    ## Version History
    * v0: Initial version.
    """

    default_task = ARITHMETIC.env_id
