"""What the package's algorithms add to one rollout of SB3's ``collect_rollouts``: :class:`RolloutExtras`.

The draws with the greedy members of self-critical groups and the exploration mixture (:mod:`sb3_grpo.engines.step`),
the bookkeeping that replaces GAE advantages by group advantages (:mod:`sb3_grpo.common.advantages.group_trackers`), the
handling of non-finite rewards (:mod:`.nonfinite`), the policy's own log-probs for the buffer, rewards scored in the
background (:mod:`.deferred_rewards`), ``carry_over`` (:mod:`sb3_grpo.common.advantages.carry_over`), and the rollout's
logs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_grpo.common.advantages.carry_over import CarryOver
from sb3_grpo.common.advantages.group_trackers import EpisodeGroupTracker
from sb3_grpo.common.buffers import PolicyLogProbMixin
from sb3_grpo.common.rollout.deferred_rewards import DeferredRewards
from sb3_grpo.common.rollout.nonfinite import NonFiniteEpisodes, check_advantages, check_log_probs
from sb3_grpo.common.rollout.redistribution import RewardRedistribution
from sb3_grpo.engines import RolloutEngine
from sb3_grpo.engines.step import StepEngine, sample_actions
from sb3_grpo.engines.turn_queues import TurnQueues
from sb3_grpo.engines.vllm_engine import VLLMTurnQueues

__all__ = ["RolloutExtras", "bootstrap_truncated", "env_actions"]


class RolloutExtras:
    """The state of one rollout beyond SB3's: draws, group advantages, non-finite rewards, deferred rewards, carry-over.

    :param action_space: The env's action space.
    :param alpha: The exploration mixture's weight for this rollout.
    :param tracker: The group advantages' tracker (``None`` for GAE), reset for this rollout.
    :param self_critical: Whether the tracker's greedy envs act greedily (``advantage="self_critical"``).
    :param nonfinite: ``"raise"`` or ``"skip"``.
    :param rollout_buffer: The buffer being filled.
    :param n_envs: Envs of the VecEnv.
    :param n_rollout_steps: Steps per env in the rollout.
    :param rng: The exploration RNG.
    """

    def __init__(
        self,
        action_space: spaces.Space,
        alpha: float,
        tracker: EpisodeGroupTracker | None,
        self_critical: bool,
        nonfinite: str,
        rollout_buffer: RolloutBuffer,
        n_envs: int,
        n_rollout_steps: int,
        rng: np.random.Generator,
    ) -> None:
        self.action_space = action_space
        self.alpha = alpha
        self.tracker = tracker
        if tracker is not None:
            tracker.reset_rollout(n_rollout_steps)
        self.greedy_envs = tracker.greedy_envs if tracker is not None and self_critical else None
        self.nonfinite = NonFiniteEpisodes(nonfinite, n_envs, n_rollout_steps)
        self.n_rollout_steps = n_rollout_steps
        # the critic's values matter only to GAE: group advantages replace GAE's and train no critic, so the
        # bootstrap values of truncated episodes and of the rollout's end are not computed then
        self.needs_values = tracker is None
        # the policy's own log-probs beside the behaviour's, for the importance-weighted KL (the package's buffers)
        self.stores_policy_log_prob = isinstance(rollout_buffer, PolicyLogProbMixin)
        self.rng = rng
        self.completion_lengths: list[int] = []  # text envs: tokens of each completion that ended in this rollout
        self.deferred: DeferredRewards | None = None  # rewards scored in the background (text envs)
        self.carry: CarryOver | None = None  # carry_over: steps held until their group advantage is known
        self.batched_bootstrap = False  # bootstrap_truncated's batched values (off where the model must equal PPO)
        # on an accelerator the draws' log-probs are checked at the rollout's end (:meth:`sample`)
        self.defer_draw_checks = False
        self.unchecked_log_probs: list[tuple[int, int, th.Tensor]] = []  # (row, timestep, log-probs)
        # engine="hf" / "vllm": the tokens decoded a turn ahead (sb3_grpo.engines); "step": none, drawn per step
        self.turns: TurnQueues | VLLMTurnQueues | None = None
        self.redistribution: RewardRedistribution | None = None  # reward_redistribution (common.redistribution)
        self.policy: BasePolicy | None = None

    @classmethod
    def start(
        cls,
        action_space: spaces.Space,
        alpha: float,
        tracker: EpisodeGroupTracker | None,
        self_critical: bool,
        nonfinite: str,
        rollout_buffer: RolloutBuffer,
        env: VecEnv,
        n_rollout_steps: int,
        rng: np.random.Generator,
        *,
        policy: BasePolicy | None = None,
        carry: CarryOver | None = None,
        on_accelerator: bool = False,
        exact_ppo: bool = False,
        engine: RolloutEngine | None = None,
        redistribution: RewardRedistribution | None = None,
    ) -> RolloutExtras:
        """The state of a rollout of ``env`` about to start (the first arguments are the constructor's, with the env
        for its number of envs), with the env's background rewards turned on where it offers them.

        :param policy: The acting policy, whose prompt prefills are warmed before the rollout (:func:`warm_prefills`).
        :param carry: ``carry_over``'s store of held sequences (``None``: off).
        :param on_accelerator: The policy is on an accelerator: the draws' log-probs are checked once, at the
            rollout's end, instead of per step (one host sync instead of one per step).
        :param exact_ppo: The model must compute what SB3's PPO computes bit for bit: no batched prefill of the
            prompts and no batched bootstrap values, which round floats differently (``GRPO`` with every extra off,
            :attr:`sb3_grpo.grpo.extras.GRPOExtras.computes_as_ppo`).
        :param engine: The model's rollout engine (:func:`sb3_grpo.engines.make_engine`; ``None``: ``"step"``), whose
            per-row queues of this rollout hand out the tokens it computed a turn ahead (none for ``"step"``, whose
            tokens are drawn in each step's policy call).
        :param redistribution: ``reward_redistribution``'s bookkeeping for this rollout (``None``: off).
        """
        extras = cls(
            action_space, alpha, tracker, self_critical, nonfinite, rollout_buffer, env.num_envs, n_rollout_steps, rng
        )
        extras.deferred = DeferredRewards.start(env)
        extras.carry = carry
        extras.redistribution = redistribution
        extras.policy = policy
        extras.defer_draw_checks = on_accelerator
        if engine is None:
            engine = StepEngine()
        if policy is not None:
            extras.turns = engine.start(
                policy, env, n_rollout_steps, alpha, extras.greedy_envs, rng, action_space, extras.needs_values
            )
        if not exact_ppo and policy is not None:  # a prefill of another batch rounds floats differently from PPO's
            warm_prefills(policy, env, n_rollout_steps)
            extras.batched_bootstrap = True  # likewise, the truncated episodes' values in one batch
        return extras

    def sample(
        self, policy: BasePolicy, obs_tensor: th.Tensor | dict[str, th.Tensor], row: int, timestep: int, n_updates: int
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """One step's actions, values, behaviour log-probs and the policy's own log-probs
        (:func:`~sb3_grpo.engines.step.sample_actions`), the behaviour log-probs checked finite
        (:func:`~sb3_grpo.common.rollout.nonfinite.check_log_probs`; ``row``, ``timestep`` and ``n_updates`` name the
        step)."""
        # the rollout's last step needs no look-ahead when no bootstrap value reads it (the update changes the
        # parameters, so the cache is rebuilt anyway); a cache that survives extends by the token at the next call
        look_ahead = self.needs_values or row != self.n_rollout_steps - 1
        try:
            if self.turns is not None:
                drawn = self.turns.sample(policy, obs_tensor, row)
            else:
                drawn = sample_actions(
                    policy, obs_tensor, self.action_space, self.alpha, self.greedy_envs, self.rng, look_ahead=look_ahead
                )
        except RuntimeError as err:  # e.g. torch.multinomial on NaN probabilities (torch's own checks are off)
            raise RuntimeError(
                f"the policy's draw failed at rollout step {row} (timestep {timestep}, update {n_updates}): "
                f"{err}. NaN/inf distribution parameters (logits, or a Gaussian's mean / std) do this: check the "
                "observations for NaN/inf and the loaded weights, or lower the learning rate."
            ) from err
        if self.defer_draw_checks:  # checked at the rollout's end, in one host sync instead of one per step
            self.unchecked_log_probs.append((row, timestep, drawn[2]))
        else:
            check_log_probs(drawn[2], row, timestep, n_updates)
        return drawn

    def check_rewards(
        self, rewards: np.ndarray, dones: np.ndarray, infos: list[dict], row: int, timestep: int, n_updates: int
    ) -> np.ndarray:
        """The step's rewards after the non-finite check (:meth:`~.nonfinite.NonFiniteEpisodes.check_rewards`). A
        non-finite reward after a non-finite draw (a NaN Gaussian action) is reported as the draw's error."""
        try:
            return self.nonfinite.check_rewards(rewards, dones, infos, row, timestep, n_updates)
        except RuntimeError:
            self.check_draws(n_updates)
            raise

    def check_draws(self, n_updates: int) -> None:
        """Check the log-probs of the draws that :meth:`sample` left unchecked (on an accelerator), in one host sync:
        the first bad step raises (:func:`~sb3_grpo.common.rollout.nonfinite.check_log_probs`)."""
        if not self.unchecked_log_probs:
            return
        finite = th.stack([th.isfinite(lp).all() for _, _, lp in self.unchecked_log_probs])
        if not bool(finite.all()):
            row, timestep, log_probs = self.unchecked_log_probs[int(th.nonzero(~finite)[0])]
            check_log_probs(log_probs, row, timestep, n_updates)
        self.unchecked_log_probs = []

    def record_step(self, row: int, rewards: np.ndarray, dones: np.ndarray, infos: list[dict]) -> None:
        """Record one step (buffer row ``row``): completion lengths, the raw rewards (before the timeout bootstrap
        adds ``gamma * V(terminal obs)``) for the group advantages, and where rewards still being scored go."""
        if self.turns is not None:
            self.turns.note_dones(dones)
        if self.deferred is not None:
            self.deferred.note(row, dones, infos, self.nonfinite.ended_first_row)
        if dones.any():
            self.completion_lengths.extend(
                len(infos[idx]["completion_ids"]) for idx in np.flatnonzero(dones) if "completion_ids" in infos[idx]
            )
        if self.tracker is not None:
            self.tracker.add(rewards, dones, infos)
        if self.redistribution is not None:
            self.redistribution.record(row, rewards, dones, infos)

    def buffer_extra(self, policy_log_probs: th.Tensor) -> dict[str, Any]:
        """Keyword arguments of ``rollout_buffer.add`` beyond SB3's (the policy's own log-probs, where stored)."""
        # without exploration they are the behaviour's log-probs, which the buffer copies from its own row
        return {"policy_log_prob": policy_log_probs} if self.stores_policy_log_prob and self.alpha > 0 else {}

    def land_rewards(self, rollout_buffer: RolloutBuffer) -> None:
        """Before returns and advantages: the rewards scored in the background, where ``step`` would have put them
        (:class:`~sb3_grpo.common.rollout.deferred_rewards.DeferredRewards`), then, with ``reward_redistribution``, each
        ended episode's reward spread over its steps
        (:class:`~sb3_grpo.common.rollout.redistribution.RewardRedistribution`).
        """
        redistribution = self.redistribution
        if self.deferred is not None:
            raw = redistribution.raw_rewards if redistribution is not None else None
            self.deferred.land(rollout_buffer, self.tracker, self.nonfinite, raw)
        if redistribution is not None:  # the end-of-episode rewards spread over the episodes' steps
            redistribution.apply(rollout_buffer.rewards, self.policy)

    def stop(self) -> bool:
        """A callback stopped the rollout: nothing more lands in this buffer. Returns ``False`` (for SB3's loop)."""
        if self.deferred is not None:
            self.deferred.stop()
        return False

    def finish(
        self, rollout_buffer: RolloutBuffer, logger: Logger, timestep: int, n_updates: int, advantage: str
    ) -> None:
        """After GAE: the check of the draws' log-probs on an accelerator (:meth:`sample`), group advantages in place
        of GAE's, episodes with non-finite rewards dropped, the check that every advantage is finite, and the
        rollout's GRPO logs."""
        self.check_draws(n_updates)
        if self.completion_lengths:
            logger.record("rollout/completion_length", float(np.mean(self.completion_lengths)))
        if self.tracker is not None:
            group_adv, stats = self.tracker.compute()
            rollout_buffer.advantages[:] = group_adv
            logger.record("rollout/group_reward_mean", stats["group_reward_mean"])
            logger.record("rollout/group_reward_std", stats["group_reward_std"])
            logger.record("rollout/n_complete_groups", stats["n_groups"])
            logger.record("rollout/frac_steps_nonzero_advantage", stats["frac_steps_nonzero_advantage"])
            for name, value in stats.items():  # the tracker's own figures (advantage="role": each baseline)
                if name.startswith("role_baseline_"):
                    logger.record(f"rollout/{name}", value)
        if self.turns is not None:  # the engine's own correction of its tokens (vLLM's importance weights)
            self.turns.finish(rollout_buffer, logger)
        self.nonfinite.drop(rollout_buffer)
        if self.nonfinite.nonfinite == "skip":
            logger.record("rollout/skipped_episodes", self.nonfinite.dropped_episodes)
        if self.carry is not None and self.tracker is not None:
            dropped = self.nonfinite.dropped_rows if self.nonfinite.nonfinite == "skip" else None
            for name, value in self.carry.settle(rollout_buffer, self.tracker, dropped).items():
                logger.record(f"rollout/{name}", value)
        check_advantages(rollout_buffer, timestep, n_updates, advantage)


#: The prompt table is prefilled before a rollout only when its tokens are at most this share of the tokens the
#: rollout generates (``num_envs * n_rollout_steps``).
WARM_TOKEN_SHARE = 0.5
#: Otherwise the prompts of this many rounds ahead of each prompt group are queued to be prefilled a few at a time
#: with the prefills the rollout runs (``prefetch_prompts``).
PREFETCH_ROUNDS = 4


def warm_prefills(policy: BasePolicy, env: VecEnv, n_rollout_steps: int, max_rows_per_env: int = 4) -> int:
    """Before a rollout: a policy with ``warm_prefills`` (:class:`~sb3_grpo.policies.CausalLMPolicy`) prefills the
    text env's prompts in one batched forward, so that the episodes that auto-reset during the rollout copy a prompt's
    keys/values instead of running a prefill each (one forward per step with a reset, otherwise). The outputs are the
    same up to float rounding (a batched forward of other rows); skipped where the model must match PPO bit for bit
    (``exact_ppo`` of :meth:`RolloutExtras.start`).

    It pays when the prompt table is small next to the rollout: a forward's fixed cost dominates a small LM's step,
    and the warm saves one forward per step with a reset. It does not pay when the table is large: the warm then
    prefills prompts the rollout never starts, and on a real model every prefilled token costs about what a generated
    one does (SmolLM2-135M, 64 envs, 32 tokens a rollout, a table of 251 chat prompts: warming them made the rollout
    1.1x to 1.4x slower, with EOS on and off, with and without prompt groups). So the table is warmed only when it
    has at most ``max_rows_per_env`` rows per env and at most :data:`WARM_TOKEN_SHARE` times the rollout's generated
    tokens. Otherwise, where the env tells the prompts its groups will draw next (``upcoming_prompt_windows``), those
    of the next :data:`PREFETCH_ROUNDS` rounds are queued in the policy (``prefetch_prompts``): nothing runs now, but
    each prefill the rollout runs anyway, when an episode starts on a prompt not yet computed, also computes a few
    of them (:data:`~sb3_grpo.policies.kv_cache.PREFETCH_ROWS`) in its forward, and the episodes that start on
    those later copy them. A rollout without such a prefill (every episode ends at its last step) computes none.

    :param n_rollout_steps: The rollout's steps per env.
    :return: How many prompts were prefilled.
    """
    warm = getattr(policy, "warm_prefills", None)
    source = env
    while source is not None and not callable(getattr(type(source), "prompt_windows", None)):
        source = getattr(source, "venv", None)
    if warm is None or source is None:
        return 0
    windows = source.prompt_windows(max_rows_per_env * env.num_envs)
    if windows is None or int(windows[1].sum()) > WARM_TOKEN_SHARE * env.num_envs * n_rollout_steps:
        prefetch = getattr(policy, "prefetch_prompts", None)
        upcoming = getattr(source, "upcoming_prompt_windows", None)
        ahead = upcoming(PREFETCH_ROUNDS) if prefetch is not None and upcoming is not None else None
        if ahead is not None:
            prefetch({"input_ids": th.as_tensor(ahead[0]), "attention_mask": th.as_tensor(ahead[1])})
        return 0
    return warm({"input_ids": th.as_tensor(windows[0]), "attention_mask": th.as_tensor(windows[1])})


def env_actions(policy: BasePolicy, action_space: spaces.Space, actions: np.ndarray) -> np.ndarray:
    """The actions as the env takes them (SB3's rescaling of squashed, clipping of Gaussian Box actions)."""
    if isinstance(action_space, spaces.Box):
        if policy.squash_output:
            # Unscale the actions to match env bounds if they were previously squashed to [-1, 1]
            return policy.unscale_action(actions)
        # Otherwise, clip the actions to avoid out of bound error
        # as we are sampling from an unbounded Gaussian distribution
        return np.clip(actions, action_space.low, action_space.high)
    return actions


def last_values(
    policy: BasePolicy, obs: Any, dones: np.ndarray, needs_values: bool, by_rows: bool, device: th.device
) -> th.Tensor:
    """The values of a rollout's last observations ``obs``, which GAE's last step bootstraps from: ``[num_envs, 1]``.

    Zeros where nothing reads them: without a critic (``needs_values=False``: group advantages), and for the envs
    whose episode ended at the last step, whose next value GAE multiplies by 0 (their observation is a new episode's
    first, whose value costs an LM a prompt prefill). When no env is still running, no call is made; the advantages
    and returns are SB3's to the bit. Otherwise, with ``by_rows``, only the running envs' observations are valued
    (a :class:`~sb3_grpo.policies.CausalLMPolicy` serves them from its look-ahead, with no forward); without it, one
    call of every env's, as SB3 makes it (``exact_ppo`` of :meth:`RolloutExtras.start`).

    :param dones: The last step's ``dones``.
    :param by_rows: Value only the running envs' rows (floats may round differently from a call of all of them).
    """
    values = th.zeros((len(dones), 1), device=device)
    running = ~np.asarray(dones, dtype=bool)
    if not needs_values or not running.any():
        return values
    if by_rows and not running.all() and isinstance(obs, (dict, np.ndarray)):
        rows = {key: value[running] for key, value in obs.items()} if isinstance(obs, dict) else obs[running]
        values[th.as_tensor(running, device=device)] = policy.predict_values(obs_as_tensor(rows, device)).reshape(-1, 1)
        return values
    return policy.predict_values(obs_as_tensor(obs, device))  # type: ignore[arg-type]


def bootstrap_truncated(
    policy: BasePolicy, gamma: float, rewards: np.ndarray, dones: np.ndarray, infos: list[dict], batched: bool = False
) -> None:
    """Handle timeout by bootstrapping with value function (SB3 GitHub issue #633): ``rewards += gamma * V(terminal
    obs)`` for truncated episodes, in place.

    :param batched: Value all the step's truncated episodes in one ``predict_values`` call (GRPO with an extra on);
        else one call per episode, as SB3's PPO does, which the PPO equivalence needs bit for bit (a batch of several
        rows may round the values' last bits differently).
    """
    truncated = [
        idx
        for idx, done in enumerate(dones)
        if done and infos[idx].get("terminal_observation") is not None and infos[idx].get("TimeLimit.truncated", False)
    ]
    if batched and len(truncated) > 1:
        terminal_obs = policy.obs_to_tensor(_stack([infos[idx]["terminal_observation"] for idx in truncated]))[0]
        with th.no_grad():
            values = policy.predict_values(terminal_obs).flatten().cpu().numpy()  # type: ignore[arg-type]
        rewards[truncated] += gamma * values.astype(rewards.dtype, copy=False)
        return
    for idx in truncated:
        terminal_obs = policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
        with th.no_grad():
            terminal_value = policy.predict_values(terminal_obs)[0]  # type: ignore[arg-type]
        rewards[idx] += gamma * terminal_value


def _stack(observations: list[Any]) -> Any:
    """One batch of single observations (arrays, or dicts of arrays as a ``Dict`` space gives them)."""
    if isinstance(observations[0], dict):
        return {key: _stack([obs[key] for obs in observations]) for key in observations[0]}
    return np.stack([np.asarray(obs) for obs in observations])
