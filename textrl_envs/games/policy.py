"""An LM policy as the opponent of a text game (:class:`PolicyOpponent`), frozen or live."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from textrl_envs.games.opponents import Opponent, OpponentTurn

__all__ = ["ENGINES", "PolicyOpponent", "copy_policy"]

#: How a :class:`PolicyOpponent` computes its moves.
ENGINES = ("auto", "cache", "recompute")


class PolicyOpponent(Opponent):
    """An LM policy as the opponent: it reads its side of the conversation and writes tokens until its turn ends.

    Every game whose opponent is to move is answered in one batched call (no gradients, the policy in eval mode,
    on its own device). Two engines compute the same moves, chosen once here (``engine``):

    * ``"cache"``: the policy's built-in decoder (``policy.turn_decoder``, a
      :class:`~sb3_grpo.policies.LiveBatch` of ``sb3_grpo``'s ``CausalLMPolicy``): one prefill of every window,
      then one single-token forward of the rows still writing per token, on the LM's own KV cache. A row whose
      window would slide within the move (its conversation is longer than the window allows) takes the
      recompute path instead.
    * ``"recompute"``: the reference, one forward of every whole window per token (``get_distribution``), for any
      SB3 policy.

    ``"auto"`` (the default) takes ``"cache"`` where the policy has a ``turn_decoder``. Both draw one uniform per
    token from the episode's generator, only for the rows still writing, and pick the token by inverse transform
    sampling, so they write the same moves for the same seeds (tested). A move's
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
    :param engine: ``"auto"``, ``"cache"`` or ``"recompute"`` (see above).
    :param chat: Speak as an instruct model: read the turn's chat messages (``OpponentTurn.messages``, which
        ``SelfPlay(chat=True)`` gives) rendered with the tokenizer's chat template and a generation prompt, end a move
        at the template's end-of-turn token, and write free text that the game reads as it reads a chat learner's
        moves. Give it ``max_turn_tokens`` for a sentence (e.g. 24) and the env's ``tokenizer``.
    """

    def __init__(
        self,
        policy: Any,
        tokenizer: Any = None,
        max_turn_tokens: int = 2,
        turn_end: Sequence[int] | None = None,
        deterministic: bool = False,
        name: str = "policy",
        engine: str = "auto",
        chat: bool = False,
    ) -> None:
        from textrl_envs.core import load_tokenizer

        if not callable(getattr(policy, "get_distribution", None)):
            raise TypeError(
                f"PolicyOpponent needs a policy with get_distribution(obs) (an SB3 policy); got {type(policy).__name__}"
            )
        self.policy, self.tokenizer = policy, load_tokenizer(tokenizer)
        self.max_turn_tokens, self.deterministic, self.name = int(max_turn_tokens), bool(deterministic), name
        eos = self.tokenizer.eos_token_id
        ends = [] if eos is None else [int(eos)]
        self.chat, self.template = bool(chat), None
        if self.chat:
            from textrl_envs.chat import end_of_turn_id, resolve_chat_template

            self.template = resolve_chat_template(self.tokenizer, True)
            eot = end_of_turn_id(self.tokenizer, self.template)
            ends = ends if eot is None or eot in ends else [eot, *ends]
        self.turn_end = tuple(turn_end) if turn_end is not None else tuple(ends)
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        self.width = int(policy.observation_space["input_ids"].shape[0])
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        has_decoder = callable(getattr(policy, "turn_decoder", None))
        if engine == "cache" and not has_decoder:
            raise ValueError(
                f"engine='cache' needs a policy with the built-in decoder (turn_decoder, as sb3_grpo's CausalLMPolicy "
                f"has); {type(policy).__name__} has none: use engine='recompute' (or 'auto')"
            )
        self.engine = "cache" if engine == "cache" or (engine == "auto" and has_decoder) else "recompute"

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
        if not turns:
            return []
        convs = [self._conversation(t) for t in turns]
        written: list[list[int]] = [[] for _ in turns]
        rows = list(range(len(turns)))
        if self.engine == "cache":
            # a row whose window would slide within the move cannot extend its cache: it is recomputed
            fits = [i for i in rows if len(convs[i]) + self.max_turn_tokens - 1 <= self.width]
            self._decode_on_cache(convs, turns, fits, written)
            rows = [i for i in rows if len(convs[i]) + self.max_turn_tokens - 1 > self.width]
        self._decode_recomputing(convs, turns, rows, written)
        if self.chat:  # the move as the model wrote it, without its end-of-turn token
            return [self.tokenizer.decode([t for t in w if t not in self.turn_end]) for w in written]
        # the turn-end token stays in the text (the tokenizer reads it back as that token), so the opponent's side of
        # the conversation holds the same tokens a learner's window would; games read past it
        return [self.tokenizer.decode(w, skip_special_tokens=False) for w in written]

    def _conversation(self, turn: OpponentTurn) -> list[int]:
        """The token ids the opponent reads: its side of the conversation as text, or (chat) its chat messages
        rendered with a generation prompt and the turn's reply prefix."""
        if not self.chat:
            return list(self.tokenizer(turn.text, add_special_tokens=False, verbose=False)["input_ids"])
        if turn.messages is None:
            raise ValueError(
                f"PolicyOpponent {self.name!r} speaks chat (chat=True) but the turn has no chat messages: play it in "
                "an instruct-mode game (SelfPlay(..., chat=True), or instruct=True on the env)"
            )
        from textrl_envs.chat import render

        text = render(self.tokenizer, self.template, list(turn.messages), where=f"{self.name}'s turn")
        text += turn.reply_prefix
        return list(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def _draw(self, probs: np.ndarray, turn: OpponentTurn) -> int:
        """The reference path's token: the mode, or inverse transform sampling with one draw of the episode's
        generator."""
        if self.deterministic:
            return int(np.argmax(probs))
        cdf = np.cumsum(probs)
        return min(int(np.searchsorted(cdf, turn.rng.random() * cdf[-1], side="right")), len(probs) - 1)

    def _decode_recomputing(
        self, convs: list[list[int]], turns: Sequence[OpponentTurn], rows: list[int], written: list[list[int]]
    ) -> None:
        """The reference: one forward of every whole window per token."""
        import torch

        live = list(rows)
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
                token = self._draw(probs[row], turns[i])
                written[i].append(token)
                if token not in self.turn_end:
                    still.append(i)
            live = still

    def _decode_on_cache(
        self, convs: list[list[int]], turns: Sequence[OpponentTurn], rows: list[int], written: list[list[int]]
    ) -> None:
        """The policy's built-in decoder: one prefill, then one single-token forward per token on its KV cache, each
        live row's uniform drawn from its episode's generator just before its token (as the reference draws it)."""
        import torch

        if not rows:
            return
        n, k, device = len(rows), self.max_turn_tokens, self.policy.device
        windows = [self._window(convs[i]) for i in rows]
        ids = torch.as_tensor(np.stack([w[0] for w in windows]), device=device)
        mask = torch.as_tensor(np.stack([w[1] for w in windows]), device=device)
        uniforms = torch.zeros((k, n, 1), dtype=torch.float32, device=device)
        no_explore = torch.zeros((k, n), dtype=torch.bool, device=device)
        stop = torch.as_tensor(self.turn_end, dtype=torch.long, device=device)

        def write(batch_rows, _steps, tokens, _log_probs, _values):
            for r, token in zip(batch_rows.tolist(), tokens.tolist()):
                written[rows[r]].append(int(token))

        with torch.no_grad():
            batch = self.policy.turn_decoder(uniforms, no_explore, no_explore.long(), stop, k, self.width)
            greedy = torch.full((n,), self.deterministic, dtype=torch.bool, device=device)
            batch.add(torch.arange(n, device=device), ids, mask, 0, greedy)
            while len(batch):
                if not self.deterministic:
                    live, steps = batch.live_rows(), batch.live_steps()
                    draws = [turns[rows[r]].rng.random() for r in live]
                    uniforms[steps, live, 0] = torch.as_tensor(draws, dtype=torch.float32, device=device)
                batch.advance(write)

    def __repr__(self) -> str:
        return f"PolicyOpponent({self.name!r}, deterministic={self.deterministic})"


def copy_policy(policy: Any) -> Any:
    """A copy of ``policy`` that plays as it does now, whatever training does to it later: the policy's own
    ``frozen_copy()`` where it has one (``sb3_grpo``'s ``CausalLMPolicy``: a LoRA policy's frozen base is shared, not
    copied, so a league of snapshots of a real model holds one base), else a copy that shares no tensor with it,
    rebuilt from SB3's constructor parameters and loaded with its state dict (a policy in the middle of a rollout
    holds cached tensors that ``deepcopy`` refuses), or a deep copy of a policy that is not an SB3 one."""
    import torch

    frozen_copy = getattr(policy, "frozen_copy", None)
    if callable(frozen_copy):
        return frozen_copy()
    make = getattr(policy, "_get_constructor_parameters", None)
    if make is None:
        return copy.deepcopy(policy)
    fresh = type(policy)(**make())
    with torch.no_grad():
        fresh.load_state_dict({k: v.detach().clone() for k, v in policy.state_dict().items()})
    return fresh.to(policy.device)
