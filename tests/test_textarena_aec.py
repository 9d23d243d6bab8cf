"""TextArena's two-player games as PettingZoo AEC envs (extras ``textrl[textarena]`` and ``textrl[games]``)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import warnings

import numpy as np
import pytest

pytest.importorskip(
    "textarena", reason="the TextArena AEC envs need the textarena extra: pip install 'textrl[textarena]'"
)
pytest.importorskip("pettingzoo", reason="the TextArena AEC envs need the games extra: pip install 'textrl[games]'")

from textrl_envs.suites.textarena_aec import OFFLINE_TWO_PLAYER_GAMES, env, player_messages  # noqa: E402


@pytest.mark.parametrize("game", OFFLINE_TWO_PLAYER_GAMES)
def test_pettingzoo_api_and_seed_tests(game):
    from pettingzoo.test import api_test, seed_test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # api_test's advice on Dict observations; games warned on random text
        api_test(env(game), num_cycles=100)
        seed_test(lambda: env(game), num_cycles=100)


def _text(e, agent):
    o = e.observe(agent)
    return e.tokenizer.decode([i for i, m in zip(o["input_ids"], o["attention_mask"]) if m])


def _play(e, move):
    tok = e.tokenizer
    for t in tok(move, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
        e.step(t)


def test_tictactoe_by_hand():
    e = env("TicTacToe-v0")
    e.reset(seed=0)
    first = e.agent_selection
    p0, p1 = first, next(a for a in e.possible_agents if a != first)
    assert "Current Board" in _text(e, p0) and _text(e, p1) == ""  # player 1 reads its messages at its turn
    for move in [" 0", " 3", " 1", " 4", " 2"]:  # the first mover takes the top row
        _play(e, move)
    assert all(e.terminations.values())
    assert e._cumulative_rewards[p0] == 1.0 and e._cumulative_rewards[p1] == -1.0
    # each window holds the other player's moves as TextArena writes them, and its own moves as tokens
    w1 = _text(e, p1)
    assert f"[Player {e.possible_agents.index(p0)}] [0]" in w1 and " 3<|endoftext|>" in w1
    assert "[GAME]" in w1.splitlines()[-1]  # the reason the game ended
    # the same seed replays the same game (Kuhn poker: the same deal and first player)
    k = env("KuhnPoker-v0")
    seen = []
    for seed in (5, 5, 6):
        k.reset(seed=seed)
        seen.append((k.agent_selection, _text(k, k.agent_selection)))
    assert seen[0] == seen[1]


def test_an_unreadable_move_loses():
    e = env("Nim-v0")
    e.reset(seed=1)
    mover = e.agent_selection
    for _ in range(3):  # TextArena allows one retry by default; the second unreadable move loses
        if e.terminations[mover]:
            break
        _play(e, " hello")
    assert e.terminations[mover] and e._cumulative_rewards[mover] == -1.0


def test_player_messages_keep_the_other_players_moves_only():
    from textarena.core import ObservationType

    msgs = [(-1, "Board", ObservationType.GAME_BOARD), (0, "[4]", ObservationType.PLAYER_ACTION),
            (1, "[2]", ObservationType.PLAYER_ACTION)]  # fmt: skip
    assert player_messages(msgs, 0) == "[GAME] Board\n[Player 1] [2]"
    assert player_messages(msgs, 1) == "[GAME] Board\n[Player 0] [4]"


def test_bad_input():
    with pytest.raises(ValueError, match="is not a two-player game"):
        env("GuessTheNumber-v0")
    with pytest.raises(ValueError, match="TextArena has no game 'TicTacTo-v0'"):
        env("TicTacTo-v0")


def test_a_tiny_lm_with_a_long_window_plays_both_seats():
    """A 2-layer Llama-style LM built from a config, 1024 positions, plays both players of Kuhn poker through the
    AEC loop (sampled tokens): the game ends, zero-sum, and each player only ever read its own window."""
    import torch as th
    from transformers import LlamaConfig, LlamaForCausalLM

    from sb3_grpo import CausalLMPolicy

    e = env("KuhnPoker-v0", window=1024, max_turn_tokens=4)
    vocab = len(e.tokenizer)
    th.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                      eos_token_id=e.tokenizer.eos_token_id))  # fmt: skip
    space = e.observation_space("player_0")
    policy = CausalLMPolicy(space, e.action_space("player_0"), lambda _: 1e-3, model=lm)
    e.reset(seed=3)
    steps, totals = 0, {a: 0.0 for a in e.possible_agents}
    for agent in e.agent_iter(max_iter=5000):
        obs, reward, term, trunc, _ = e.last()
        totals[agent] += reward
        assert space.contains(obs)
        action = None if term or trunc else int(policy.predict({k: v[None] for k, v in obs.items()})[0][0])
        e.step(action)
        steps += 1
    assert not e.agents and steps > 2
    assert np.isclose(sum(totals.values()), 0.0)
