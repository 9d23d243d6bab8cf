"""The ``"hf"`` rollout engine (:class:`DecoderEngine`): the policy's built-in decoder computes whole turns ahead.

``engine="step"`` (the default, the reference) is SB3's loop as it is: one policy call per env step, each computing
one token per row (:func:`~sb3_grpo.engines.step.sample_actions`). ``engine="hf"`` has the policy's built-in decoder
(:class:`~sb3_grpo.policies.LiveBatch`) decode whole turns ahead, keeps the tokens in per-row queues
(:class:`TurnQueues`), and hands the loop one token per row per step from them. The env, its rewards and replies,
SB3's callbacks, the monitor and the buffer see the transitions they see with ``"step"``, one token at a time.

**Queues.** A row is refilled when its queue is empty (an episode's start, after a reply) or when the window the env
shows is not the one its queue expects (the env ended the episode, or appended a reply, before the queue ran out):
the rest of the queue is discarded and the row joins the decoder's live batch again from the window it has now. The
live batch is shared by all rows whatever step they are at (continuous batching): a decoding call runs one forward
of every live row per token, on until some row's turn ends, so a row that resets never decodes alone, and without
EOS one call decodes every row's whole episode.

**The same draws.** The step path draws one uniform per row per step from torch's generator (inverse-transform
sampling) and, with exploration, numpy draws from the exploration RNG. :class:`TurnQueues` makes those very draws at
the rollout's start, as tables indexed by (rollout step, row) (one ``torch.rand`` of ``n_steps x n_envs`` is the same
stream as ``n_steps`` draws of ``n_envs``), and a token consumed at rollout step ``t`` uses the step path's draw of
step ``t``: with the same seed both engines draw the same tokens from the same distributions, and leave the random
generators in the same state. The log-probs and values are the same computation over a different KV-cache layout
(which rows share the cache, and so how many masked columns precede a row's, differs), so they agree to float
rounding (about 1e-6), not to the bit; a token can differ only where a uniform falls within that rounding of a
boundary of the cumulative distribution. A callback that stops a rollout early leaves torch's generator further on
than the step path would (the table is drawn whole).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.objectives import mixture_log_prob, uniform_log_prob, uniform_sample

__all__ = ["DecoderEngine", "TurnQueues", "check_decoder_policy", "next_window", "text_spec"]


class DecoderEngine:
    """``engine="hf"``: the policy's built-in decoder computes each row's turn ahead, into :class:`TurnQueues` made
    for each rollout."""

    name = "hf"
    #: no importance correction: the decoder draws from the policy's own distribution, with the step path's draws
    importance_cap = None

    def before_rollout(self, policy: BasePolicy, n_updates: int) -> None:
        """Nothing to prepare: the decoder is the policy's own."""

    def weights_changed(self) -> None:
        """Nothing holds a copy of the weights."""

    def start(self, *args: Any, **kwargs: Any) -> TurnQueues:
        """The queues of one rollout: ``(policy, env, n_steps, alpha, greedy_envs, rng, action_space, needs_values)``,
        :class:`TurnQueues`' arguments."""
        return TurnQueues(*args, **kwargs)


def check_decoder_policy(policy: BasePolicy, action_space: spaces.Space) -> None:
    """Refuse a policy the built-in decoder cannot run, when the model is built."""
    if not callable(getattr(policy, "turn_decoder", None)) or not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"engine='hf' decodes tokens with the policy's built-in decoder, which {type(policy).__name__} does not "
            "have (it needs CausalLMPolicy on a text env); use engine='step'"
        )
    if getattr(policy, "separate_critic", False):
        raise ValueError(
            "engine='hf' values states by the value head on the decoder's hidden states; a separate critic "
            "(separate_critic=True) reads whole windows, which the decoder does not build: use engine='step'"
        )


def next_window(ids: th.Tensor, mask: th.Tensor, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """The window each row shows after its action, if the env appends it and nothing else (shifted left by one)."""
    return (
        th.cat([ids[:, 1:], actions[:, None]], dim=1),
        th.cat([mask[:, 1:], th.ones_like(mask[:, :1])], dim=1),
    )


def text_spec(env: VecEnv) -> Any:
    """The text env's spec (stop tokens, budgets), or ``None``."""
    try:
        return env.get_attr("text_spec", [0])[0]
    except (AttributeError, IndexError, TypeError):
        return None


class TurnQueues:
    """The ``"hf"`` engine's state for one rollout: the draw tables, the per-row queues of decoded tokens, the decoder's
    live batch (:class:`~sb3_grpo.policies.LiveBatch`) and the window each row's queue expects next.

    At a step where some row has no token queued, the rows that need a new window (an episode's start, a reply, an
    episode the env ended early) join the live batch with one prefill, and the live batch decodes: one forward of
    every live row per token, on until some row's turn ends (its EOS or end-of-turn token, or the budget), so that
    each call decodes as many tokens as it can while the batch stays whole; the rows ahead keep their tokens queued.

    :param policy: The acting policy (with ``turn_decoder``).
    :param env: The rollout's env (its text spec gives the stop tokens and the episode budget).
    :param n_steps: Steps of the rollout.
    :param alpha: The exploration mixture's weight for this rollout.
    :param greedy_envs: The self-critical groups' greedy rows (read when a row joins), or ``None``.
    :param rng: The exploration RNG.
    :param action_space: The env's (``Discrete``) action space.
    :param needs_values: GAE reads the values of the states turns end in (truncated episodes, the rollout's last
        state): the decoder puts them in the policy's prefill memo (``LiveBatch(remember_ends=True)``).
    """

    def __init__(
        self,
        policy: BasePolicy,
        env: VecEnv,
        n_steps: int,
        alpha: float,
        greedy_envs: np.ndarray | None,
        rng: np.random.Generator,
        action_space: spaces.Space,
        needs_values: bool = False,
    ) -> None:
        n_envs = env.num_envs
        device = policy.device
        if alpha > 0 and greedy_envs is not None:
            raise ValueError(
                "engine='hf' cannot combine exploration (explore_alpha > 0) with advantage='self_critical' (whose "
                "greedy rows change which rows explore as episodes end); use engine='step' or explore_alpha=0"
            )
        # the step path's draws, made now in its order: one uniform per row per step (torch's generator) ...
        uniforms = th.rand((n_steps, n_envs, 1), device=device)
        # ... and, exploring, which rows explore and their uniform tokens (the exploration RNG)
        explore = np.zeros((n_steps, n_envs), dtype=bool)
        explore_tokens = np.zeros((n_steps, n_envs), dtype=np.int64)
        if alpha > 0:
            for t in range(n_steps):
                explored = rng.random(n_envs) < alpha
                explore[t] = explored
                if explored.any():
                    explore_tokens[t, explored] = uniform_sample(action_space, int(explored.sum()), rng)
        spec = text_spec(env)
        stops = [] if spec is None else [spec.eos_token_id, *getattr(spec, "turn_end_ids", ())]
        stop_ids = th.as_tensor(sorted({int(s) for s in stops if s is not None}), dtype=th.long, device=device)
        # a single-turn episode's EOS terminates it: no value of the state after it is ever read
        terminal = (
            [] if spec is None or spec.interaction is not None or spec.eos_token_id is None else [spec.eos_token_id]
        )
        terminal_ids = th.as_tensor(terminal, dtype=th.long, device=device)
        width = int(policy.observation_space["input_ids"].shape[-1])  # type: ignore[index]
        self.live = policy.turn_decoder(  # type: ignore[operator]
            uniforms,
            th.as_tensor(explore, device=device),
            th.as_tensor(explore_tokens, device=device),
            stop_ids,
            n_steps if spec is None else int(spec.max_agent_steps),
            width,
            needs_values,
            terminal_ids,
        )
        self.alpha = alpha
        self.greedy_envs = greedy_envs
        self.action_space = action_space
        self.tokens = th.zeros((n_envs, n_steps), dtype=th.long, device=device)
        self.log_probs = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.values = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.until = np.zeros(n_envs, dtype=np.int64)  # row r's queue holds the tokens of steps < until[r]
        self.ended = np.ones(n_envs, dtype=bool)  # rows whose episode ended at the last step (all: none started)
        self.expected: tuple[th.Tensor, th.Tensor] | None = None
        self.joins = 0  # rows that joined the live batch (one prefill row each)

    def note_dones(self, dones: np.ndarray) -> None:
        """The step's episode ends: those rows' queues are discarded."""
        self.ended = np.asarray(dones, dtype=bool).copy()

    def finish(self, rollout_buffer: Any, logger: Any) -> None:
        """After the rollout's advantages: nothing to correct (the tokens are the policy's own draws)."""

    def _write(self, rows: th.Tensor, steps: th.Tensor, tokens: th.Tensor, log_probs: th.Tensor, values: th.Tensor):
        self.tokens[rows, steps] = tokens
        self.log_probs[rows, steps] = log_probs
        self.values[rows, steps] = values
        self.until[rows.cpu().numpy()] = steps.cpu().numpy() + 1

    def sample(self, policy: BasePolicy, obs_tensor: Any, t: int) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """Rollout step ``t``'s actions, values, behaviour log-probs and the policy's own log-probs, as
        :func:`~sb3_grpo.engines.step.sample_actions` returns them."""
        ids, mask = policy._parse_obs(obs_tensor)  # type: ignore[attr-defined]
        if self.expected is None:
            same = np.zeros(len(self.until), dtype=bool)
        else:
            exp_ids, exp_mask = self.expected
            same = ((ids == exp_ids) & (mask == exp_mask)).all(dim=-1).cpu().numpy()
        same &= ~self.ended
        live = np.zeros(len(self.until), dtype=bool)
        live[self.live.live_rows()] = True
        # a row continues from its queue or its live decode while its window is the one expected; else it joins anew
        stale = ~same | ((self.until <= t) & ~live)
        if stale.any():
            rows = th.as_tensor(np.flatnonzero(stale), device=ids.device)
            self.live.remove(rows)
            greedy = np.zeros(len(rows), dtype=bool) if self.greedy_envs is None else self.greedy_envs[stale]
            self.live.add(rows, ids[rows], mask[rows], t, th.as_tensor(greedy, device=ids.device))
            self.until[stale] = t
            self.joins += len(rows)
        if (self.until <= t).any():
            while len(self.live) and not self.live.advance(self._write):
                pass
        actions = self.tokens[:, t]
        values = self.values[:, t]
        log_probs = self.log_probs[:, t]
        self.expected = next_window(ids, mask, actions)
        behaviour = log_probs
        if self.alpha > 0:
            mixed = mixture_log_prob(log_probs, uniform_log_prob(self.action_space, actions), self.alpha)
            greedy = np.zeros(len(self.until), dtype=bool) if self.greedy_envs is None else self.greedy_envs
            behaviour = th.where(th.as_tensor(~greedy, device=log_probs.device), mixed, log_probs)
        return actions, values.unsqueeze(-1), behaviour, log_probs
