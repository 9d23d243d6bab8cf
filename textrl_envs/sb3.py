"""The stable-baselines3 ``VecEnv`` adapter over :class:`~textrl_envs.vector.TextGenVectorEnv`.

SB3 algorithms step a ``VecEnv``: numpy observations, ``dones`` instead of terminated/truncated,
same-step autoreset with the last observation in ``infos[i]["terminal_observation"]``, and a list of
per-env info dicts. :class:`TextGenSB3VecEnv` presents the batched text env that way, without
splitting it into N single envs::

    from stable_baselines3 import PPO
    from textrl_envs.sb3 import make_vec_env

    venv = make_vec_env("TextGen-v0", n_envs=16, group_size=4, seed=0)   # VecMonitor-wrapped
    model = PPO("MultiInputPolicy", venv).learn(10_000)
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import VecEnv, VecMonitor
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from textrl_envs.validation import check_bool, check_int, check_mapping, check_seed
from textrl_envs.vector import TextGenVectorEnv

#: Keys of the vector env's step infos that are per-env reset info of an autoreset episode.
_RESET_KEYS = ("prompt", "prompt_index")


def _item(value: Any) -> Any:
    """numpy scalars to Python scalars; everything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def unbatch_info(infos: dict[str, Any], i: int, keys: Sequence[str] | None = None) -> dict[str, Any]:
    """Env ``i``'s entries of a gymnasium vector info dict (``key`` / ``_key`` mask pairs).

    :param infos: Dict of arrays with ``_key`` masks (nested dicts are unbatched recursively).
    :param i: The env index.
    :param keys: Only these keys (default: all that are set for env ``i``).
    :return: A plain dict with Python scalars where the value is a numpy scalar.
    """
    out: dict[str, Any] = {}
    for key in keys if keys is not None else [k for k in infos if not k.startswith("_")]:
        if key not in infos:
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        value = infos[key]
        out[key] = unbatch_info(value, i) if isinstance(value, dict) else _item(value[i])
    return out


class TextGenSB3VecEnv(VecEnv):
    """SB3 ``VecEnv`` view of one :class:`~textrl_envs.vector.TextGenVectorEnv` (numpy backend).

    * ``reset()`` returns the observation dict; ``reset_infos[i]`` holds env ``i``'s ``prompt``,
      ``prompt_index``, ``group_id`` and ``episode_id``. Seeds set by :meth:`seed` (env ``i`` gets
      ``seed + i``) and options set by :meth:`set_options` are used at the next ``reset()`` only, as
      in SB3.
    * ``step_wait()`` returns ``(obs, rewards (float32), dones, infos)`` with same-step autoreset.
      ``infos[i]`` always has ``group_id``, ``episode_id`` (of the episode the action belonged to)
      and ``TimeLimit.truncated`` (truncated and not terminated), interactive envs also ``turn`` (the agent turn
      of the action, from 0); when env ``i``'s episode ended it
      also has ``terminal_observation`` (the last observation, a dict of arrays) and the episode's
      ``prompt``, ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``, while
      ``reset_infos[i]`` is updated with the new episode's reset info (ids included).
    * ``get_attr(name)`` returns the batched env's attribute once per requested index;
      ``set_attr`` sets it on the batched env (so for all envs: indices must be all of them);
      ``env_method`` calls the batched env's method once and returns its result once per index;
      ``env_is_wrapped`` is ``False`` (there are no per-env gym wrappers).

    :param venv: The vector env; it must use ``obs_backend="numpy"``.
    """

    def __init__(self, venv: TextGenVectorEnv) -> None:
        base = venv.unwrapped
        if not isinstance(base, TextGenVectorEnv):
            raise TypeError(f"TextGenSB3VecEnv wraps a TextGenVectorEnv; got {type(base).__name__}")
        if base.obs_backend != "numpy":
            raise ValueError(
                f"SB3 needs numpy observations; the vector env uses obs_backend={base.obs_backend!r}. "
                "Create it with obs_backend='numpy' (the default)"
            )
        self.venv = venv
        self.spec = getattr(venv, "spec", None)
        self._actions: np.ndarray | None = None
        super().__init__(venv.num_envs, venv.single_observation_space, venv.single_action_space)
        self.metadata = dict(venv.metadata, render_modes=list(venv.metadata.get("render_modes", [])))

    @property
    def group_size(self) -> int:
        """Envs per prompt group."""
        return self.venv.unwrapped.group_size

    # -- VecEnv API ------------------------------------------------------------------------------
    def reset(self) -> VecEnvObs:
        """Reset every env (with the seeds/options set since the last reset, then forget them)."""
        seeds = None if all(s is None for s in self._seeds) else list(self._seeds)
        options = self._common_options()
        obs, infos = self.venv.reset(seed=seeds, options=options)
        self.reset_infos = [unbatch_info(infos, i) for i in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Store the actions for :meth:`step_wait`."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step the batched env and convert to SB3's ``(obs, rewards, dones, infos)``."""
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async(actions)")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, infos = self.venv.step(actions)
        dones = terminated | truncated
        time_limit = truncated & ~terminated
        group_id, episode_id = infos["group_id"], infos["episode_id"]
        out = [
            {"group_id": int(group_id[i]), "episode_id": int(episode_id[i]), "TimeLimit.truncated": bool(time_limit[i])}
            for i in range(self.num_envs)
        ]
        if "turn" in infos:  # interactive episodes: the agent turn each action belongs to
            for i, turn in enumerate(infos["turn"].tolist()):
                out[i]["turn"] = int(turn)
        if dones.any():
            final_info, final_obs = infos["final_info"], infos["final_obs"]
            new_group, new_episode = self.venv.unwrapped.group_ids(), self.venv.unwrapped.episode_ids()
            for i in np.flatnonzero(dones):
                out[i].update(unbatch_info(final_info, i))
                out[i]["terminal_observation"] = final_obs[i]
                reset_info = unbatch_info(infos, i, _RESET_KEYS)
                reset_info.update(group_id=int(new_group[i]), episode_id=int(new_episode[i]))
                self.reset_infos[i] = reset_info
        return obs, rewards.astype(np.float32), dones, out

    def close(self) -> None:
        """Close the batched env."""
        self.venv.close()

    def defer_rewards(self, on: bool = True) -> bool:
        """The batched env's :meth:`~textrl_envs.vector.TextGenVectorEnv.defer_rewards`: score finished episodes in
        a background thread (``step`` returns reward 0 and ``info["reward_ticket"]`` for them) or in ``step``."""
        return self.venv.unwrapped.defer_rewards(on)

    def prompt_windows(self, max_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The batched env's :meth:`~textrl_envs.vector.TextGenVectorEnv.prompt_windows`."""
        return self.venv.unwrapped.prompt_windows(max_rows)

    def upcoming_prompt_windows(self, rounds: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
        """The batched env's :meth:`~textrl_envs.vector.TextGenVectorEnv.upcoming_prompt_windows`."""
        return self.venv.unwrapped.upcoming_prompt_windows(rounds)

    def collect_rewards(self, wait: bool = True) -> list:
        """The batched env's :meth:`~textrl_envs.vector.TextGenVectorEnv.collect_rewards`."""
        return self.venv.unwrapped.collect_rewards(wait)

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seeds for the next ``reset()``: env ``i`` gets ``seed + i`` (group ``k`` uses ``seed + kG``)."""
        seeds = super().seed(seed)
        self.action_space.seed(seeds[0])
        return seeds

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """The batched env's attribute, once per index (it is the same for every env)."""
        value = getattr(self.venv, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set an attribute of the batched env, which all envs share."""
        self._require_all(indices, f"set_attr({attr_name!r})")
        setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Call a method of the batched env once; its result is returned once per index."""
        result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
        return [result for _ in self._get_indices(indices)]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:  # noqa: ARG002  (SB3 VecEnv signature)
        """Always ``False``: the batched env has no per-env gym wrappers."""
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Each env's transcript frame with ``render_mode="rgb_array"``; ``None`` per env otherwise."""
        if self.render_mode == "rgb_array":
            return list(self.venv.render())
        return [None for _ in range(self.num_envs)]

    def render(self, mode: str | None = None) -> Any:
        """``"ansi"``: the tuple of ``prompt|completion so far`` strings; ``"human"``: print them;
        ``"rgb_array"``: the envs' frames tiled into one image (SB3's ``VecEnv.render``)."""
        mode = mode or self.render_mode
        if mode is None or mode != self.render_mode or mode == "rgb_array":
            return super().render(mode=mode)  # SB3 warns and returns None, or tiles the frames
        frames = self.venv.unwrapped.render_text()
        if mode == "human":
            print("\n".join(frames))
            return None
        return frames

    # -- internals -------------------------------------------------------------------------------
    def _common_options(self) -> dict[str, Any] | None:
        options = [o or {} for o in self._options]
        if not any(options):
            return None
        if any(o != options[0] for o in options[1:]):
            raise ValueError(
                "the batched text env resets all envs with one options dict, but set_options() gave "
                "different options per env; pass a single dict, e.g. set_options({'prompt': 'The movie was'})"
            )
        return dict(options[0])

    def _require_all(self, indices: VecEnvIndices, what: str) -> None:
        if indices is not None and sorted(set(self._get_indices(indices))) != list(range(self.num_envs)):
            raise ValueError(
                f"{what} on a subset of envs: the {self.num_envs} envs are one batched env that shares its "
                "attributes; call it with indices=None"
            )


class PicklableVecMonitor(VecMonitor):
    """SB3's ``VecMonitor``, picklable (SB3's ``VecEnvWrapper`` keeps a dict of its class's members, which holds a
    ``mappingproxy`` that ``pickle`` refuses; it is rebuilt on unpickling). ``SubprocVecEnv``, ``copy.deepcopy``
    and checkpoint tools that pickle the env then work. A monitor that writes a ``filename`` holds an open file and
    still does not pickle."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("class_attributes", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.class_attributes = dict(inspect.getmembers(self.__class__))


def _builds_text_vector_env(spec: gym.envs.registration.EnvSpec) -> bool:
    entry = spec.vector_entry_point
    if isinstance(entry, str):
        try:
            entry = gym.envs.registration.load_env_creator(entry)
        except (ImportError, AttributeError):
            return False
    return isinstance(entry, type) and issubclass(entry, TextGenVectorEnv)


def make_vec_env(
    env_id: str | None,
    n_envs: int = 1,
    group_size: int = 1,
    device: str = "auto",
    seed: int | None = None,
    monitor: bool = True,
    monitor_kwargs: dict[str, Any] | None = None,
    **env_kwargs: Any,
) -> VecEnv:
    """An SB3 ``VecEnv`` of ``n_envs`` text envs, stepped as one batched, torch-native env.

    :param env_id: A registered text env id (``"TextGen-v0"``, ...), or ``None`` to build one from
        ``env_kwargs`` alone (``prompts``, ``reward`` and ``tokenizer`` then required).
    :param n_envs: Number of envs.
    :param group_size: Envs per prompt group (must divide ``n_envs``); see
        :class:`~textrl_envs.vector.TextGenVectorEnv`.
    :param device: Where the token state lives: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``.
        Observations are numpy either way.
    :param seed: Seed of the first ``reset()`` (env ``i`` gets ``seed + i``) and of the action space.
    :param monitor: Wrap in SB3's ``VecMonitor``, so ``rollout/ep_rew_mean`` and ``ep_len_mean``
        appear in SB3 logs.
    :param monitor_kwargs: Keyword arguments of ``VecMonitor`` (``filename``, ``info_keywords``).
    :param env_kwargs: The env's keyword arguments (``prompts``, ``reward``, ``tokenizer``,
        ``max_new_tokens``, ...).
    :return: A ``VecEnv`` (a picklable ``VecMonitor`` around :class:`TextGenSB3VecEnv` when ``monitor``).
    """
    backend = env_kwargs.pop("obs_backend", "numpy")
    if backend != "numpy":
        raise ValueError(f"SB3 needs numpy observations; obs_backend={backend!r} is not supported here")
    n_envs = check_int("n_envs", n_envs, low=1, example=8)
    group_size = check_int("group_size", group_size, low=1, hint="1 (no groups) or the completions per prompt, e.g. 4")
    seed = check_seed("seed", seed)
    monitor = check_bool("monitor", monitor)
    monitor_kwargs = check_mapping("monitor_kwargs", monitor_kwargs, hint="e.g. {'info_keywords': ('completion',)}")
    if env_id is None:
        venv = TextGenVectorEnv(num_envs=n_envs, device=device, group_size=group_size, **env_kwargs)
    else:
        import textrl_envs

        if not _builds_text_vector_env(gym.spec(env_id)):
            raise ValueError(
                f"{env_id!r} is not a textrl_envs text env (its vector_entry_point is not TextGenVectorEnv); "
                f"use one of {', '.join(textrl_envs.ENV_IDS)}, or env_id=None with prompts/reward/tokenizer"
            )
        venv = gym.make_vec(
            env_id,
            num_envs=n_envs,
            vectorization_mode="vector_entry_point",
            device=device,
            group_size=group_size,
            **env_kwargs,
        )
        if not isinstance(venv.unwrapped, TextGenVectorEnv):
            raise ValueError(f"{env_id!r} does not build a TextGenVectorEnv (got {type(venv.unwrapped).__name__})")
    vec: VecEnv = TextGenSB3VecEnv(venv)
    if seed is not None:
        vec.seed(seed)
    if monitor:
        vec = PicklableVecMonitor(vec, **(monitor_kwargs or {}))
    return vec
