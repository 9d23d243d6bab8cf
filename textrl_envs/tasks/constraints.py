"""``Keywords-v0``: write a review that uses given keywords, within a length range, without repeating itself."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import KEYWORDS


class KeywordsEnv(TextGenEnv):
    """Constrained generation: a short review that uses every keyword, keeps to a length range, does not repeat itself.

    ## Description
    Prompts name 1-3 aspects of a film, ``"Keywords: music, ending. Review:"``, a fixed seeded list
    (:func:`textrl_envs.tasks.keyword_prompts`); the agent writes the review.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``16 + 24 = 40``), right-aligned, pad on
    the left with mask 0.

    ## Rewards
    0 on every step but the last. At the end, a :class:`~textrl_envs.rewards.CompositeReward`:

    ``r = 1.0 * coverage + 0.5 * length + 0.5 * repetition`` where ``coverage`` is the fraction of
    the keywords in the completion (whole words, case-insensitive, simple inflections; ``[0, 1]``),
    ``length = -min(1, 0.1 * d)`` with ``d`` the number of words outside ``[4, 20]`` (``[-1, 0]``),
    and ``repetition = -(1 - distinct bigrams / bigrams)`` of the completion's words (``(-1, 0]``).
    Range ``[-1, 1]``; 1.0 for a 4-20 word review with every keyword and no repeated bigram. The
    env's ``unwrapped.text_spec.reward.last_components`` holds the three parts of the last call.

    ## Starting State
    A prompt drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})``
    picks one (a prompt given as text has no keywords, so the reward raises for it).

    ## Episode End
    Terminated when the agent emits EOS; truncated after ``max_new_tokens = 24`` tokens. The final
    ``info`` holds ``prompt``, ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    ``gym.make("Keywords-v0", prompts=None, reward=None, reward_kwargs=None, tokenizer=None,
    max_new_tokens=24, max_prompt_tokens=16, prompt_truncation="left", render_mode=None)``. Own
    prompts are dicts ``{"prompt": ..., "keywords": [...]}``; other weights with
    ``reward_kwargs={"components": [("keywords", 1.0), ("length", 0.2, {"max_words": 12})]}``.

    ## Vectorized environment
    ``gym.make_vec("Keywords-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`.

    ## Version History
    * v0: Initial version.
    """

    default_task = KEYWORDS.env_id
