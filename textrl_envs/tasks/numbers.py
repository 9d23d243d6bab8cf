"""``IncreasingNumbers-v0``: RL4LMs' synthetic task, write a strictly increasing sequence of integers."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import INCREASING_NUMBERS


class IncreasingNumbersEnv(TextGenEnv):
    """Synthetic sequence task (RL4LMs' "increasing numbers"): write integers in strictly increasing order.

    ## Description
    Prompts are ``"Numbers:"``, optionally followed by up to two increasing starting numbers in 0-49
    (``"Numbers: 3 17"``), a fixed seeded list of distinct prompts (:func:`textrl_envs.tasks.number_prompts`). The
    agent continues the list; the bundled LM has seen such lists in its corpus, mostly but not always
    increasing, so RL has something to fix.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``8 + 20 = 28``), right-aligned, pad on
    the left with mask 0.

    ## Rewards
    0 on every step but the last. At the end (:class:`~textrl_envs.rewards.IncreasingNumbersReward`,
    ``target = 8``): with ``words = completion.split()`` and ``run`` the length of the strictly
    increasing run at the start of the integers among ``words`` (each must also exceed the prompt's
    last number, if it ends in one), ``r = run / max(len(words), 8)``, range ``[0, 1]``. Eight or more
    increasing integers and nothing else earn 1.0; other words lower the reward.

    ## Starting State
    A prompt drawn uniformly with the env's ``np_random``; ``reset(options=...)`` picks one with
    ``{"prompt": str}`` or ``{"prompt_index": int}``.

    ## Episode End
    Terminated when the agent emits EOS; truncated after ``max_new_tokens = 20`` tokens. The final
    ``info`` holds ``prompt``, ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    ``gym.make("IncreasingNumbers-v0", prompts=None, reward=None, reward_kwargs=None, tokenizer=None,
    max_new_tokens=20, max_prompt_tokens=8, prompt_truncation="left", render_mode=None)``;
    ``reward_kwargs={"target": k}`` sets the length that earns full credit.

    ## Vectorized environment
    ``gym.make_vec("IncreasingNumbers-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`.

    ## Version History
    * v0: Initial version.
    """

    default_task = INCREASING_NUMBERS.env_id
