"""Reward models: the protocol, the registry, the built-in rewards, composition and evaluation metrics.

A reward model scores a batch of completions, called with keywords as Hugging Face TRL calls its reward functions
(``prompts=``, ``completions=``, ``completion_ids=``, ``trainer_state=`` and the metadata columns;
:mod:`~textrl_envs.rewards.calls`), so TRL's reward functions plug in unchanged; ``reward=[f, g]`` is their sum, and
``None`` leaves a reward out of it. Built-in rewards by registered name (``make_reward(name, **kwargs)`` or
``reward=name`` in ``gym.make``):

* ``sentiment``: :class:`LexiconSentiment`, VADER compound in [-1, 1] (or [0, 1])
* ``classifier``: :class:`HFClassifierReward`, P(label) of a local HF classifier, [0, 1] (or its logit)
* ``exact-match``: :class:`ExactMatch`, 1 if completion == answer, {0, 1}
* ``arithmetic``: :class:`ArithmeticReward`, exact 1, partial credit below, [0, 1]
* ``increasing-numbers``: :class:`IncreasingNumbersReward`, increasing run / max(words, target), [0, 1]
* ``rouge-l``: :class:`RougeL`, max ROUGE-L F1 over references, [0, 1]
* ``bleu``: :class:`Bleu`, sentence BLEU / 100, [0, 1]
* ``keywords``: :class:`KeywordCoverage`, fraction of keywords present, [0, 1]
* ``length``: :class:`LengthPenalty`, -min(cap, per_word * distance), [-cap, 0]
* ``repetition``: :class:`RepetitionPenalty`, -(1 - distinct-n ratio), (-1, 0]
* ``coherence``: :class:`Coherence`, 1 - mean NLL / log V under a reference LM (default the bundled one), [0, 1]
* ``composite``: :class:`CompositeReward`, weighted sum of components
* ``unit-tests``: :class:`~textrl_envs.rewards.code.UnitTests`, unit tests passed in the sandbox, [0, 1]
* ``final-answer``: :class:`~textrl_envs.rewards.answers.FinalAnswerReward`, the final answer of free text (or of a
  tool transcript) == answer, {0, 1} (+ an optional format bonus)

Heavy libraries (vaderSentiment, rouge-score, sacrebleu, transformers, torch) are imported only when a reward that
needs them is built.

Modules: ``base`` (the :class:`RewardModel` protocol and :func:`call_reward`, the one place rewards are called and
checked), ``calls`` (what a call gives a reward, read from its signature;
:class:`~textrl_envs.rewards.calls.TrainerState`), ``registry`` (names -> factories), ``composite`` (weighted sums),
and the built-ins by kind: ``sentiment``, ``match`` (verifiable answers), ``overlap`` (ROUGE/BLEU against reference
texts), ``constraints`` (keywords, length, repetition), ``coherence`` (fluency under a reference LM); ``metrics``
holds evaluation metrics, not rewards.

A new built-in reward: a :class:`RewardModel` subclass in the module of its kind (or a new module here), decorated
with ``@register_reward("name")``; import it below and add it to the list above. Importing this package registers
every built-in name.
"""

from textrl_envs.rewards.answers import FinalAnswerReward
from textrl_envs.rewards.base import RewardModel, call_reward
from textrl_envs.rewards.code import UnitTests
from textrl_envs.rewards.coherence import Coherence
from textrl_envs.rewards.composite import ComponentMeanReader, CompositeReward
from textrl_envs.rewards.constraints import KeywordCoverage, LengthPenalty, RepetitionPenalty
from textrl_envs.rewards.match import ArithmeticReward, ExactMatch, IncreasingNumbersReward
from textrl_envs.rewards.metrics import distinct_n, mean_length, pass_at_k, perplexity, repetition_rate
from textrl_envs.rewards.overlap import Bleu, RougeL
from textrl_envs.rewards.registry import make_reward, register_reward, registered_rewards, resolve_reward
from textrl_envs.rewards.sentiment import HFClassifierReward, LexiconSentiment

__all__ = [
    "ArithmeticReward",
    "Bleu",
    "Coherence",
    "ComponentMeanReader",
    "CompositeReward",
    "ExactMatch",
    "FinalAnswerReward",
    "HFClassifierReward",
    "IncreasingNumbersReward",
    "KeywordCoverage",
    "LengthPenalty",
    "LexiconSentiment",
    "RepetitionPenalty",
    "RewardModel",
    "RougeL",
    "UnitTests",
    "call_reward",
    "distinct_n",
    "make_reward",
    "mean_length",
    "pass_at_k",
    "perplexity",
    "register_reward",
    "registered_rewards",
    "repetition_rate",
    "resolve_reward",
]
