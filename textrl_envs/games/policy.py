"""An LM policy as the opponent of a text game (:class:`PolicyOpponent`), frozen or live."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from textrl_envs.games.opponents import Opponent, OpponentTurn

__all__ = ["PolicyOpponent", "copy_policy"]


class PolicyOpponent(Opponent):
    """An LM policy as the opponent: it reads its side of the conversation and writes tokens until its turn ends.

    One batched forward pass per token for every game whose opponent is to move (no gradients, the policy in
    eval mode, on its own device; the whole window each time, no KV cache: a move is a token or two). A move's
    text keeps its turn-end token (EOS: ``"3<|endoftext|>"``), so the opponent's side of the conversation is
    tokenized back to the tokens a learner in its seat would see. Tokens are sampled from the policy's
    distribution with each episode's own generator (``deterministic=True``: the most likely token), so seeded
    episodes replay.

    :param policy: A policy with ``get_distribution(obs)`` over the text envs' ``Dict`` observation (an SB3
        ``ActorCriticPolicy``, such as ``sb3_grpo``'s ``CausalLMPolicy``). It is used as given; call
        :meth:`snapshot` for a frozen copy of a policy that keeps training.
    :param tokenizer: The env's tokenizer (``None``: the bundled one).
    :param max_turn_tokens: Most tokens of a move.
    :param turn_end: Token ids that end a move (``None``: the tokenizer's EOS).
    :param deterministic: Greedy moves instead of sampled ones.
    :param name: How the opponent is named in logs.
    """

    def __init__(
        self,
        policy: Any,
        tokenizer: Any = None,
        max_turn_tokens: int = 2,
        turn_end: Sequence[int] | None = None,
        deterministic: bool = False,
        name: str = "policy",
    ) -> None:
        from textrl_envs.core import load_tokenizer

        if not callable(getattr(policy, "get_distribution", None)):
            raise TypeError(
                f"PolicyOpponent needs a policy with get_distribution(obs) (an SB3 policy); got {type(policy).__name__}"
            )
        self.policy, self.tokenizer = policy, load_tokenizer(tokenizer)
        self.max_turn_tokens, self.deterministic, self.name = int(max_turn_tokens), bool(deterministic), name
        eos = self.tokenizer.eos_token_id
        self.turn_end = tuple(turn_end) if turn_end is not None else (() if eos is None else (int(eos),))
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        self.width = int(policy.observation_space["input_ids"].shape[0])

    @classmethod
    def snapshot(cls, policy: Any, **kwargs: Any) -> PolicyOpponent:
        """An opponent playing a frozen copy of ``policy``: a new policy of its class built from its constructor
        arguments (SB3's ``_get_constructor_parameters``, else a deep copy) with its weights copied in, in eval
        mode, every parameter without gradients, so training the original never changes it."""
        frozen = copy_policy(policy)
        if hasattr(frozen, "set_training_mode"):
            frozen.set_training_mode(False)
        else:
            frozen.eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return cls(frozen, **kwargs)

    def _window(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        ids = ids[-self.width :]
        out = np.full(self.width, self.pad, dtype=np.int64)
        mask = np.zeros(self.width, dtype=np.int64)
        if ids:
            out[-len(ids) :], mask[-len(ids) :] = ids, 1
        return out, mask

    def moves(self, turns: Sequence[OpponentTurn]) -> list[str]:
        import torch

        if not turns:
            return []
        convs = [list(self.tokenizer(t.text, add_special_tokens=False, verbose=False)["input_ids"]) for t in turns]
        written: list[list[int]] = [[] for _ in turns]
        live = list(range(len(turns)))
        device = getattr(self.policy, "device", torch.device("cpu"))
        for _ in range(self.max_turn_tokens):
            if not live:
                break
            windows = [self._window(convs[i] + written[i]) for i in live]
            obs = {
                "input_ids": torch.as_tensor(np.stack([w[0] for w in windows]), device=device),
                "attention_mask": torch.as_tensor(np.stack([w[1] for w in windows]), device=device),
            }
            with torch.no_grad():
                probs = self.policy.get_distribution(obs).distribution.probs.double().cpu().numpy()
            still = []
            for row, i in enumerate(live):
                p = probs[row]
                if self.deterministic:
                    token = int(np.argmax(p))
                else:
                    cdf = np.cumsum(p)
                    token = min(int(np.searchsorted(cdf, turns[i].rng.random() * cdf[-1], side="right")), len(p) - 1)
                written[i].append(token)
                if token not in self.turn_end:
                    still.append(i)
            live = still
        # the turn-end token stays in the text (the tokenizer reads it back as that token), so the opponent's side of
        # the conversation holds the same tokens a learner's window would; games read past it
        return [self.tokenizer.decode(w, skip_special_tokens=False) for w in written]

    def __repr__(self) -> str:
        return f"PolicyOpponent({self.name!r}, deterministic={self.deterministic})"


def copy_policy(policy: Any) -> Any:
    """A copy of ``policy`` that shares no tensor with it: rebuilt from SB3's constructor parameters and loaded
    with its state dict (a policy in the middle of a rollout holds cached tensors that ``deepcopy`` refuses), or
    a deep copy of a policy that is not an SB3 one."""
    import torch

    make = getattr(policy, "_get_constructor_parameters", None)
    if make is None:
        return copy.deepcopy(policy)
    fresh = type(policy)(**make())
    with torch.no_grad():
        fresh.load_state_dict({k: v.detach().clone() for k, v in policy.state_dict().items()})
    return fresh.to(policy.device)
