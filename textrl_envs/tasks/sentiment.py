"""``TextGen-v0`` and ``LongReview-v0``: steer the bundled LM towards positive movie reviews (scored by VADER),
short, or long and fluent."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import LONG_REVIEW, SENTIMENT


class SentimentEnv(TextGenEnv):
    """Positive-sentiment steering: continue a movie review so that it reads as positive.

    The classic RL-for-LMs task (RL4LMs' and TRL's IMDB examples) at toy scale, on the bundled
    tokenizer and LM, which were trained on the same synthetic review corpus the prompts come from.

    ## Description
    Each episode starts from a review opener such as ``"The movie was"``; the agent writes the rest
    of the review one token per step, and the completion is scored by the VADER lexicon.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token (bundled tokenizer: a small byte-level BPE).

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``8 + 24 = 32``). The sequence is
    right-aligned: the newest token sits at index ``W - 1``; slots on the left hold the pad id with
    mask 0.

    ## Rewards
    0 on every step but the last. At the end, ``r = VADER compound(completion)`` in ``[-1, 1]``
    (:class:`~textrl_envs.rewards.LexiconSentiment`; the prompt itself is not scored). Use
    ``reward_kwargs={"scale": "prob"}`` for ``(compound + 1) / 2`` in ``[0, 1]``, or
    ``reward="classifier"`` for the bundled Hugging Face sentiment classifier's P(POSITIVE).

    ## Starting State
    One of the 16 review openers of :data:`textrl_envs.assets.corpus.REVIEW_OPENERS`, drawn uniformly
    with the env's ``np_random``; ``reset(options={"prompt": str})`` or ``{"prompt_index": int}``
    picks one.

    ## Episode End
    Terminated when the agent emits EOS (``<|endoftext|>``); truncated after ``max_new_tokens = 24``
    tokens. The final ``info`` holds ``prompt``, ``completion``, ``completion_ids``, ``prompt_index``
    and ``reward``.

    ## Arguments
    ``gym.make("TextGen-v0", prompts=None, reward=None, reward_kwargs=None, tokenizer=None,
    max_new_tokens=24, max_prompt_tokens=8, prompt_truncation="left", render_mode=None)``; any of
    them overrides the default (``reward`` takes a registered name, a ``RewardModel`` or a callable
    ``f(prompts, completions, **kwargs) -> floats``).

    ## Vectorized environment
    ``gym.make_vec("TextGen-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`.

    ## Version History
    * v0: Initial version.
    """

    default_task = SENTIMENT.env_id


class LongReviewEnv(TextGenEnv):
    """Long positive review: 96 tokens of text that reads as positive, fluent and not repetitive.

    The long-generation condition of the claims study (``textrl-bench claims``): every completion is 96 tokens, so
    credit must be assigned over four times the length of ``TextGen-v0``'s, and the reward scores the whole text.

    ## Description
    Each episode starts from a review opener such as ``"The movie was"`` and always runs ``max_new_tokens = 96``
    tokens: EOS does not end the episode. The bundled LM writes short reviews separated by EOS (10-20 tokens
    each), so an untrained policy writes several reviews in a row; the EOS tokens are dropped from the text (as
    every special token is), which is scored as one review.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token (bundled tokenizer: a small byte-level BPE).

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``8 + 96 = 104``, within the bundled LM's 128
    positions). The sequence is right-aligned: the newest token sits at index ``W - 1``.

    ## Rewards
    0 on every step but the last. At the end, the sum of three terms of the completion (a ``composite``
    reward, :class:`~textrl_envs.rewards.CompositeReward`):

    - ``sentiment``: VADER compound of the whole text, in ``[-1, 1]``;
    - ``coherence``: ``clip(1 - nll / log V, 0, 1)``, with ``nll`` the completion's mean negative log-likelihood
      per token under the frozen bundled LM given the prompt (:class:`~textrl_envs.rewards.Coherence`): 1 for text
      the reference finds certain, 0 for text no likelier than a uniform guess;
    - ``repetition``: ``-(1 - distinct bigrams / bigrams)``, in ``(-1, 0]``
      (:class:`~textrl_envs.rewards.RepetitionPenalty`).

    Range ``[-2, 2]``. Positive words alone do not pay: word salad loses coherence, and repeating the one review
    the LM knows best loses to the repetition term, which only bites on long text.

    ## Starting State
    One of the 16 review openers of ``TextGen-v0``, drawn uniformly with the env's ``np_random``;
    ``reset(options={"prompt": str})`` or ``{"prompt_index": int}`` picks one.

    ## Episode End
    Truncated after ``max_new_tokens = 96`` tokens; never terminated (EOS is an ordinary token here). The final
    ``info`` holds ``prompt``, ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    As ``TextGen-v0``: ``gym.make("LongReview-v0", prompts=None, reward=None, reward_kwargs=None,
    tokenizer=None, max_new_tokens=96, max_prompt_tokens=8, ...)``.

    ## Vectorized environment
    ``gym.make_vec("LongReview-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`.

    ## Version History
    * v0: Initial version.
    """

    default_task = LONG_REVIEW.env_id
