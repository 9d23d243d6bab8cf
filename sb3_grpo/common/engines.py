"""The rollout engine seam: who computes the tokens of a text rollout.

``engine="step"`` (the default, the reference) is SB3's loop as it is: one policy call per env step, each computing
one token per row (:func:`~sb3_grpo.common.draws.sample_actions`). ``engine="hf"`` asks the policy's built-in decoder
(:func:`~sb3_grpo.policies.decoder.decode_turns`) for a whole turn per row at a time, up to its end token, EOS or the
budget, keeps the tokens in per-row queues (:class:`TurnQueues`), and hands the loop one token per row per step from
them. The env, its rewards and replies, SB3's callbacks, the monitor and the buffer see the transitions they see
with ``"step"``, one token at a time.

**Queues.** A row is refilled when its queue is empty (an episode's start, after a reply) or when the window the env
shows is not the one its queue expects (the env ended the episode, or appended a reply, before the queue ran out):
the rest of the queue is discarded and the row decodes again from the window it has now.

**The same draws.** The step path draws one uniform per row per step from torch's generator (inverse-transform
sampling) and, with exploration, numpy draws from the exploration RNG. :class:`TurnQueues` makes those very draws at
the rollout's start, as tables indexed by (rollout step, row) (one ``torch.rand`` of ``n_steps x n_envs`` is the same
stream as ``n_steps`` draws of ``n_envs``), and a token consumed at rollout step ``t`` uses the step path's draw of
step ``t``: with the same seed both engines draw the same tokens from the same distributions, and leave the random
generators in the same state. The log-probs and values are the same computation over a different KV-cache layout
(the step path keeps all rows in one right-aligned cache that changes as rows reset; the decoder keeps its own), so
they agree to float rounding (about 1e-6), not to the bit; a token can differ only where a uniform falls within that
rounding of a boundary of the cumulative distribution.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.objectives import mixture_log_prob, uniform_log_prob, uniform_sample

__all__ = ["ENGINES", "TurnQueues", "check_engine", "check_engine_policy"]

#: The rollout engines: ``"step"`` (SB3's loop, one token per policy call) and ``"hf"`` (the built-in decoder).
ENGINES = ("step", "hf")


def check_engine(engine: Any) -> str:
    """``engine`` if it names a rollout engine, else a ``ValueError`` that lists them."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"engine must be one of {', '.join(repr(e) for e in ENGINES)}, got {engine!r}; 'step' computes one token "
            "per env step (SB3's loop), 'hf' decodes a whole turn per row with the policy's built-in decoder"
        )
    return engine


def check_engine_policy(engine: str, policy: BasePolicy, action_space: spaces.Space) -> None:
    """Refuse an engine the policy cannot run, when the model is built."""
    if engine == "step":
        return
    if not callable(getattr(policy, "decode_turns", None)) or not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"engine={engine!r} decodes tokens with the policy's built-in decoder, which {type(policy).__name__} does "
            "not have (it needs CausalLMPolicy on a text env); use engine='step'"
        )


def _text_spec(env: VecEnv) -> Any:
    try:
        return env.get_attr("text_spec", [0])[0]
    except (AttributeError, IndexError, TypeError):
        return None


class TurnQueues:
    """The ``"hf"`` engine's state for one rollout: the draw tables, the per-row queues of decoded tokens, and the
    window each row's queue expects next.

    :param policy: The acting policy (with ``decode_turns``).
    :param env: The rollout's env (its text spec gives the stop tokens and the episode budget).
    :param n_steps: Steps of the rollout.
    :param alpha: The exploration mixture's weight for this rollout.
    :param greedy_envs: The self-critical groups' greedy rows (read at each refill), or ``None``.
    :param rng: The exploration RNG.
    :param action_space: The env's (``Discrete``) action space.
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
    ) -> None:
        n_envs = env.num_envs
        device = policy.device
        if alpha > 0 and greedy_envs is not None:
            raise ValueError(
                "engine='hf' cannot combine exploration (explore_alpha > 0) with advantage='self_critical' (whose "
                "greedy rows change which rows explore as episodes end); use engine='step' or explore_alpha=0"
            )
        # the step path's draws, made now in its order: one uniform per row per step (torch's generator) ...
        self.uniforms = th.rand((n_steps, n_envs, 1), device=device)
        # ... and, exploring, which rows explore and their uniform tokens (the exploration RNG)
        self.explore = np.zeros((n_steps, n_envs), dtype=bool)
        self.explore_tokens = np.zeros((n_steps, n_envs), dtype=np.int64)
        if alpha > 0:
            for t in range(n_steps):
                explore = rng.random(n_envs) < alpha
                self.explore[t] = explore
                if explore.any():
                    self.explore_tokens[t, explore] = uniform_sample(action_space, int(explore.sum()), rng)
        spec = _text_spec(env)
        stops = [] if spec is None else [spec.eos_token_id, *getattr(spec, "turn_end_ids", ())]
        self.stop_ids = th.as_tensor(sorted({int(s) for s in stops if s is not None}), dtype=th.long, device=device)
        self.max_tokens = n_steps if spec is None else int(spec.max_agent_steps)
        self.n_steps = n_steps
        self.alpha = alpha
        self.greedy_envs = greedy_envs
        self.action_space = action_space
        self.tokens = th.zeros((n_envs, n_steps), dtype=th.long, device=device)
        self.log_probs = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.values = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.until = np.zeros(n_envs, dtype=np.int64)  # row r's queue holds the tokens of steps < until[r]
        self.expected: tuple[th.Tensor, th.Tensor] | None = None
        self.decoded_tokens = 0  # tokens decoded, consumed or not (the engine's waste is decoded - consumed)
        self.refills = 0

    def note_dones(self, dones: np.ndarray) -> None:
        """The step's episode ends: those rows' queues are discarded."""
        self.until[np.asarray(dones, dtype=bool)] = 0

    def sample(self, policy: BasePolicy, obs_tensor: Any, t: int) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """Rollout step ``t``'s actions, values, behaviour log-probs and the policy's own log-probs, as
        :func:`~sb3_grpo.common.draws.sample_actions` returns them."""
        ids, mask = policy._parse_obs(obs_tensor)
        queued = self.until > t
        if self.expected is not None and queued.any():
            exp_ids, exp_mask = self.expected
            same = ((ids == exp_ids) & (mask == exp_mask)).all(dim=-1).cpu().numpy()
            queued &= same
        if not queued.all():
            self._refill(policy, ids, mask, np.flatnonzero(~queued), t)
        actions = self.tokens[:, t]
        values = self.values[:, t]
        log_probs = self.log_probs[:, t]
        self.expected = (
            th.cat([ids[:, 1:], actions[:, None]], dim=1),
            th.cat([mask[:, 1:], th.ones_like(mask[:, :1])], dim=1),
        )
        behaviour = log_probs
        if self.alpha > 0:
            mixed = mixture_log_prob(log_probs, uniform_log_prob(self.action_space, actions), self.alpha)
            greedy = np.zeros(len(self.until), dtype=bool) if self.greedy_envs is None else self.greedy_envs
            behaviour = th.where(th.as_tensor(~greedy, device=log_probs.device), mixed, log_probs)
        return actions, values.unsqueeze(-1), behaviour, log_probs

    def _refill(self, policy: BasePolicy, ids: th.Tensor, mask: th.Tensor, rows_np: np.ndarray, t: int) -> None:
        n_tokens = max(1, min(self.max_tokens, self.n_steps - t))
        rows = th.as_tensor(rows_np, device=ids.device)
        steps = slice(t, t + n_tokens)
        greedy = np.zeros(len(rows_np), dtype=bool) if self.greedy_envs is None else self.greedy_envs[rows_np]
        decoded = policy.decode_turns(  # type: ignore[operator]
            ids[rows],
            mask[rows],
            uniforms=self.uniforms[steps, rows].transpose(0, 1),
            greedy=th.as_tensor(greedy, device=ids.device),
            explore=th.as_tensor(self.explore[steps][:, rows_np].T, device=ids.device),
            explore_tokens=th.as_tensor(self.explore_tokens[steps][:, rows_np].T, device=ids.device),
            stop_ids=self.stop_ids,
        )
        width = decoded.tokens.shape[1]
        self.tokens[rows, t : t + width] = decoded.tokens
        self.log_probs[rows, t : t + width] = decoded.log_probs
        self.values[rows, t : t + width] = decoded.values
        lengths = decoded.lengths.cpu().numpy()
        self.until[rows_np] = t + lengths
        self.decoded_tokens += int(lengths.max()) * len(rows_np)
        self.refills += 1
