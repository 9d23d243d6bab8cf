"""``TextArena-v0``: TextArena's single-player games as interactive episodes (extra ``textrl[textarena]``).

Every test but the missing-extra one needs the extra (the ``test`` extra installs it). The games are cheap (a
reset is a millisecond); the no-network test runs one fresh interpreter with every socket refused.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random
import subprocess
import sys
import textwrap
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.tasks import TEXTARENA

TA = TEXTARENA.env_id


def test_missing_extra_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # makes `import textarena` raise ImportError
    with pytest.raises(ImportError, match=r'TextArena-v0 needs .*textarena.*pip install "textrl\[textarena\]"'):
        gym.make(TA)
    with pytest.raises(ImportError, match=r'pip install "textrl\[textarena\]"'):
        gym.make_vec(TA, num_envs=2, device="cpu")


pytest.importorskip("textarena")  # everything below needs the extra


def play_turn(env, text: str):
    """Step the tokens of ``text`` then EOS (one agent turn); return the last step's ``(obs, reward, term, trunc,
    info)``."""
    tok = env.unwrapped.text_spec.tokenizer
    for token in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
        out = env.step(token)
        if out[2] or out[3]:
            break
    return out


def last_game_line(env, obs) -> str:
    """The game's last message in the observation, as an agent reads it."""
    ids = obs["input_ids"][obs["attention_mask"] == 1]
    return env.unwrapped.text_spec.tokenizer.decode(ids).rsplit("[GAME]", 1)[-1]


@pytest.mark.parametrize("game", ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small"])
def test_env_checkers(game):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(TA, game=game, max_new_tokens=640, max_turn_tokens=4)
    assert env.unwrapped.observation_space["input_ids"].shape == (16 + 640,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gym_check_env(env.unwrapped, skip_render_check=True)
        sb3_check_env(env.unwrapped, warn=False)


@pytest.mark.parametrize("seed", range(4))
def test_guess_the_number_by_binary_search_from_the_replies_wins(seed):
    """Halving the range after each 'higher' / 'lower' the game writes finds the number: the game's reward 1."""
    env = gym.make(TA, game="GuessTheNumber-v0")
    obs, info = env.reset(seed=seed)
    assert "You are playing Guess The Number" in last_game_line(env, obs) and info["prompt"] == "GuessTheNumber-v0\n"
    target = env.unwrapped._task_state["env"].game_number  # the game's secret, to check the search against
    low, high, turns = 1, 20, 0
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = play_turn(env, str(guess))
        turns += 1
        if terminated or truncated:
            break
        assert reward == 0.0
        hint = last_game_line(env, obs)
        low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
        assert low <= target <= high
    assert terminated and not truncated and guess == target and reward == 1.0
    assert info["turns"] == turns <= 5 and "Congratulations" in info["transcript"][-1]["text"]
    assert [m["role"] for m in info["transcript"][:3]] == ["env", "env", "agent"]  # prompt, opening, first move


def test_a_lost_game_pays_the_games_own_partial_reward():
    """Out of turns, GuessTheNumber pays 1 - |last guess - number| / (max - min): the reward is the game's."""
    env = gym.make(TA, game="GuessTheNumber-v0", game_kwargs={"max_number": 8, "max_turns": 2})
    env.reset(seed=3)
    target = env.unwrapped._task_state["env"].game_number
    wrong = [g for g in range(1, 9) if g != target][:3]
    for i, guess in enumerate(wrong):  # TextArena checks its turn limit before counting the turn: 3 guesses
        text = f"[{guess}]" if i else str(guess)  # a move in brackets of its own is sent as it is
        _, reward, terminated, truncated, info = play_turn(env, text)
        if terminated or truncated:
            break
        assert reward == 0.0
    assert terminated and not truncated and info["turns"] == 3 and "turn limit" in info["transcript"][-1]["text"]
    assert reward == pytest.approx(1 - abs(wrong[-1] - target) / (8 - 1)) and 0 < reward < 1


def test_tower_of_hanoi_solved_move_by_move():
    env = gym.make(TA, game="TowerOfHanoi-v0")
    obs, _ = env.reset(seed=0)
    assert "A: [3, 2, 1]" in last_game_line(env, obs)
    moves = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]  # the 7-move solution for 3 disks
    for i, move in enumerate(moves):
        obs, reward, terminated, truncated, info = play_turn(env, move)
        assert terminated == (i == len(moves) - 1) and not truncated
    assert reward == 1.0 and info["turns"] == 7 and "solved" in info["transcript"][-1]["text"]
    env.reset(seed=0)
    _, reward, terminated, *_ = play_turn(env, "A B C")  # no valid move: the game warns, the episode goes on
    assert reward == 0.0 and not terminated


def test_vector_env_matches_sync_and_groups_share_the_game():
    kw = {"game": "GuessTheNumber-v0", "game_kwargs": {"max_number": 8, "max_turns": 3}, "max_turn_tokens": 3}
    n = 4
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(TA, **kw) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = gym.make_vec(TA, num_envs=n, device="cpu", **kw)
    assert type(vec).__name__ == "TextArenaVectorEnv"
    s, v = sync.reset(seed=7), vec.reset(seed=7)
    np.testing.assert_array_equal(s[0]["input_ids"], v[0]["input_ids"])
    tok = vec.text_spec.tokenizer
    digits = [tok(str(d), add_special_tokens=False)["input_ids"][0] for d in range(1, 9)]
    rng, eos, rewards = np.random.default_rng(0), vec.text_spec.eos_token_id, []
    for _ in range(120):  # digits, EOS now and then, and now and then a token that is no move at all
        actions = np.where(rng.random(n) < 0.45, eos, rng.choice(digits, n))
        actions[rng.random(n) < 0.05] = tok("x", add_special_tokens=False)["input_ids"][0]
        s, v = sync.step(actions), vec.step(actions)
        for key in ("input_ids", "attention_mask"):
            np.testing.assert_array_equal(s[0][key], v[0][key])
        for a, b in zip(s[1:4], v[1:4]):
            np.testing.assert_array_equal(a, b)
        rewards += list(v[1][v[2] | v[3]])
    assert len(rewards) > 10 and 1.0 in rewards and min(rewards) < 1.0  # won and lost games, scored alike

    grouped = gym.make_vec(TA, num_envs=6, group_size=3, device="cpu", **kw)
    single = gym.make(TA, **kw)
    for seed in range(3):
        grouped.reset(seed=seed)
        numbers = [grouped._turn_book.states[j]["env"].game_number for j in range(6)]
        assert numbers[:3] == [numbers[0]] * 3 and numbers[3:] == [numbers[3]] * 3  # one game per group
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a reset after an opening alone warns of no cut episode
            single.reset(seed=seed + 3)  # group 1 is seeded like env 3 of a SyncVectorEnv
        assert single.unwrapped._task_state["env"].game_number == numbers[3]


def test_each_game_draws_from_its_own_random_stream():
    """Games seed and draw from Python's global random: interleaving two games changes neither, nor the caller's."""
    kw = {"game": "Minesweeper-v0-small", "max_turn_tokens": 6}

    def transcript(env, moves):
        return [play_turn(env, m)[0]["input_ids"].tolist() for m in moves]

    moves = ["0 0", "3 4", "2 2", "1 4"]
    alone = gym.make(TA, **kw)
    alone.reset(seed=5)
    expected = transcript(alone, moves)
    a, b = gym.make(TA, **kw), gym.make(TA, **kw)
    random.seed(123)
    caller = random.getstate()
    a.reset(seed=5)
    b.reset(seed=6)
    got = []
    for move in moves:
        got.append(play_turn(a, move)[0]["input_ids"].tolist())
        play_turn(b, move)
    assert got == expected and random.getstate() == caller


def test_a_game_that_raises_ends_the_episode_with_reward_zero(monkeypatch):
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    env = gym.make(TA, game="GuessTheNumber-v0")
    env.reset(seed=0)

    def broken(self, action):
        raise IndexError("a bug in the game")

    monkeypatch.setattr(GuessTheNumberEnv, "step", broken)
    with pytest.warns(UserWarning, match=r"raised IndexError\('a bug in the game'\) on turn 1 .*reward 0"):
        _, reward, terminated, truncated, info = play_turn(env, "5")
    assert terminated and reward == 0.0 and "failed" in info["transcript"][-1]["text"]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"game": "GuessTheNumbr-v0"}, ValueError, r"no game 'GuessTheNumbr-v0'; did you mean 'GuessTheNumber-v0'"),
        ({"game": 3}, TypeError, "game must be a TextArena game id"),
        ({"game": "TicTacToe-v0"}, ValueError, "'TicTacToe-v0' is not a single-player game"),
        ({"game": "QuantumTicTacToe-v0"}, ValueError, "is a TwoPlayerState game, not a single-player one"),
        ({"game_kwargs": {"colour": 1}}, ValueError, r"rejected game_kwargs \{'colour': 1\}"),
        ({"game_kwargs": 1}, TypeError, "game_kwargs must be a dict"),
        ({"bracket_actions": "yes"}, TypeError, "bracket_actions must be a bool"),
        ({"interaction": object()}, TypeError, "takes no interaction="),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make(TA, **kwargs)


def test_offline_games_and_nltk_data_without_network(tmp_path):
    """With every socket refused: the listed logic games play; a word game without its NLTK data fails naming the
    data and NLTK_DATA (nothing is downloaded); with the data in an NLTK_DATA directory, it plays."""
    words = tmp_path / "nltk_data" / "corpora" / "words"
    words.mkdir(parents=True)
    for name in ("en", "en-basic"):
        (words / name).write_text("apple\nhouse\nriver\n")
    code = textwrap.dedent(
        f"""
        import socket
        def refuse(*a, **k):
            raise OSError("network is off in this test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        import nltk
        nltk.data.path[:] = []  # no data on disk but what this test provides
        import gymnasium as gym, numpy as np, textrl_envs
        from textrl_envs.suites.textarena import MissingGameData
        rng = np.random.default_rng(0)
        for game in ["GuessTheNumber-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Minesweeper-v0-small", "Countdown-v0",
                     "Mastermind-v0", "LightsOut-v0", "Sudoku-v0-very-easy"]:
            env = gym.make("{TA}", game=game, max_new_tokens=1400, max_turn_tokens=4)
            env.reset(seed=0)
            for _ in range(12):
                if any(env.step(int(rng.integers(env.action_space.n)))[2:4]):
                    break
        try:
            gym.make("{TA}", game="Wordle-v0")
            raise SystemExit("Wordle-v0 made without its NLTK data")
        except MissingGameData as err:
            assert "NLTK_DATA" in str(err) and "python -m nltk.downloader" in str(err), err
        nltk.data.path[:] = [{str(tmp_path / "nltk_data")!r}]
        env = gym.make("{TA}", game="Hangman-v0")
        env.reset(seed=0)
        assert env.unwrapped._task_state["env"].state.game_state["target_word"] in ("apple", "house", "river")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-1000:] + out.stderr[-3000:]
