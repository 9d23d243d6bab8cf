"""``CommonGen-v0``: write a sentence using given concepts, scored against reference sentences."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import COMMONGEN


class CommonGenEnv(TextGenEnv):
    """Reference-based generation (CommonGen-style): write a sentence that uses the given concepts.

    ## Description
    Prompts list 2-4 concepts, ``"Concepts: actor, story, love. Sentence:"``, each with three
    reference sentences (``" The actor loved the story."``), a fixed seeded list of about 200
    (:func:`textrl_envs.tasks.concept_prompts`). The agent writes one sentence.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``16 + 20 = 36``), right-aligned, pad on
    the left with mask 0.

    ## Rewards
    0 on every step but the last. At the end (:class:`~textrl_envs.rewards.RougeL`):
    ``r = max_j ROUGE-L F1(completion, references[j])`` (``rouge-score``, Porter stemming, lower
    case), range ``[0, 1]``. ``reward="bleu"`` gives sacrebleu's smoothed sentence BLEU / 100
    against all references instead; ``reward="composite"`` with ``reward_kwargs={"components":
    {"rouge-l": 1.0, "bleu": 1.0}}`` both.

    ## Starting State
    A prompt drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})``
    picks one (a prompt given as text has no references, so the reward raises for it).

    ## Episode End
    Terminated when the agent emits EOS; truncated after ``max_new_tokens = 20`` tokens. The final
    ``info`` holds ``prompt``, ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    ``gym.make("CommonGen-v0", prompts=None, reward=None, reward_kwargs=None, tokenizer=None,
    max_new_tokens=20, max_prompt_tokens=16, prompt_truncation="left", render_mode=None)``. Own
    prompts are dicts ``{"prompt": ..., "references": [...]}``.

    ## Vectorized environment
    ``gym.make_vec("CommonGen-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`.

    ## Version History
    * v0: Initial version.
    """

    default_task = COMMONGEN.env_id
