"""The policies ``GRPO`` accepts by name (sb3-contrib's ``policies.py``): SB3's actor-critic policies, and
``"CausalLMPolicy"`` (:class:`sb3_grpo.policies.CausalLMPolicy`, imported when first asked for: it pulls in
``transformers``)."""

from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy, MultiInputActorCriticPolicy

MlpPolicy = ActorCriticPolicy
CnnPolicy = ActorCriticCnnPolicy
MultiInputPolicy = MultiInputActorCriticPolicy

__all__ = ["CnnPolicy", "MlpPolicy", "MultiInputPolicy"]
