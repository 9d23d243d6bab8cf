"""Two-player text games: the pure logic played by hand, the self-play ids, the PettingZoo AEC envs."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest

import textrl_envs  # noqa: F401  (registers the ids)
from textrl_envs.games import (
    Forfeit,
    KuhnPoker,
    Nim,
    Opponent,
    SelfPlay,
    TicTacToe,
    make_game,
    play_moves,
)
from textrl_envs.games.kuhn import KuhnState
from textrl_envs.games.nim import NimState

GAME_IDS = ["TicTacToe-v0", "Nim-v0", "KuhnPoker-v0"]
RNG = np.random.default_rng(0)

# -- the games, played by hand ----------------------------------------------------------------------------------


def test_tictactoe_by_hand():
    g = TicTacToe()
    s = g.initial(RNG)
    assert g.render(s, 0) == " ......... x=" and g.legal(s) == list(range(1, 10)) and g.to_move(s) == 0
    s = play_moves(g, s, [" 5", " 1", " 9", " 3"])
    assert g.render(s, 0) == " o.o.x...x x=" and g.render(s, 1) == " x.x.o...o x="  # each from its own side
    assert not g.over(s) and g.to_move(s) == 0
    s = play_moves(g, s, ["I take 2"])  # player 0 blocks; the first digit is the move
    s = play_moves(g, s, [" 8", " 7", " 4"])  # o: 8, x: 7, o: 4
    assert not g.over(s)
    s = play_moves(g, s, [" 6"])  # the ninth mark: o x o / o x x / x o x, no line
    assert g.over(s) and g.payoffs(s) == (0.0, 0.0) and g.render(s, 0) == " oxooxxxox x="
    # a clean win for the first player on the diagonal
    w = play_moves(g, g.initial(RNG), [" 1", " 2", " 5", " 3", " 9"])
    assert (
        g.over(w) and g.payoffs(w) == (1.0, -1.0) and g.result_text(w, 0) == " win" and g.result_text(w, 1) == " loss"
    )
    # a draw: x o x / x o o / o x x
    d = play_moves(g, g.initial(RNG), [" 1", " 2", " 3", " 5", " 4", " 6", " 8", " 7", " 9"])
    assert g.over(d) and g.payoffs(d) == (0.0, 0.0) and g.result_text(d, 1) == " draw"


def test_tictactoe_illegal_and_unreadable_moves_forfeit():
    g = TicTacToe()
    s = play_moves(g, g.initial(RNG), [" 5", " 5"])  # player 1 plays a taken cell
    assert isinstance(s, Forfeit) and s.player == 1 and g.payoffs(s) == (1.0, -1.0)
    assert g.result_text(s, 1) == " loss (illegal)" and g.result_text(s, 0) == " win (opponent illegal)"
    s = play_moves(g, g.initial(RNG), [" hello"])
    assert isinstance(s, Forfeit) and s.player == 0 and g.payoffs(s) == (-1.0, 1.0)
    with pytest.raises(ValueError, match="the game is over"):
        play_moves(g, s, [" 1"])
    with pytest.raises(ValueError, match="cell 5 is taken"):
        g.play(g.play(g.initial(RNG), 5), 5)


def test_tictactoe_heuristic_wins_then_blocks():
    g = TicTacToe()
    s = play_moves(g, g.initial(RNG), [" 1", " 4", " 2", " 5"])  # x to move: 3 wins; o threatens 6
    assert g.heuristic(s, RNG) == 3
    s = play_moves(g, g.initial(RNG), [" 1", " 5", " 2"])  # o to move: must block 3
    assert g.heuristic(s, RNG) == 3
    assert g.heuristic(g.initial(RNG), RNG) == 5


def test_nim_by_hand():
    g = Nim()
    s = NimState(7)
    assert g.render(s, 0) == g.render(s, 1) == " 7 left, x=" and g.legal(s) == [1, 2, 3]
    s = play_moves(g, s, [" 3", " 3"])  # 1 left, player 0 to move
    assert g.legal(s) == [1] and g.to_move(s) == 0
    s = play_moves(g, s, [" 1"])
    assert g.over(s) and g.payoffs(s) == (1.0, -1.0)  # player 0 took the last stone
    assert isinstance(play_moves(g, NimState(2), [" 3"]), Forfeit)  # more than is left
    assert isinstance(play_moves(g, NimState(9), [" 4"]), Forfeit)  # more than max_take
    heaps = {g.initial(np.random.default_rng(i)).heap for i in range(200)}
    assert heaps == set(range(5, 13))
    assert g.heuristic(NimState(10), RNG) == 2 and g.heuristic(NimState(9), RNG) == 1
    with pytest.raises(ValueError, match="low <= high"):
        Nim(low=4, high=2)


def test_nim_heuristic_wins_every_winnable_heap():
    g = Nim()
    for heap in range(1, 30):
        for seed in range(3):
            rng = np.random.default_rng(seed)
            s = NimState(heap)
            while not g.over(s):  # player 0 heuristic, player 1 random
                move = g.heuristic(s, rng) if g.to_move(s) == 0 else int(rng.integers(1, min(3, s.heap) + 1))
                s = g.play(s, move)
            assert (g.payoffs(s)[0] == 1.0) == (heap % 4 != 0) or heap % 4 == 0


def test_kuhn_poker_by_hand():
    g = KuhnPoker()
    q_vs_k = KuhnState((1, 2))
    assert g.render(q_vs_k, 0) == " Q -, x=" and g.render(q_vs_k, 1) == " K -, x="
    assert g.payoffs(play_moves(g, q_vs_k, [" p", " p"])) == (-1.0, 1.0)  # showdown for 1
    assert g.payoffs(play_moves(g, q_vs_k, [" b", " b"])) == (-2.0, 2.0)  # bet, call: showdown for 2
    assert g.payoffs(play_moves(g, q_vs_k, [" b", " fold"])) == (1.0, -1.0)  # player 1 folds
    s = play_moves(g, q_vs_k, [" check", " bet"])
    assert not g.over(s) and g.render(s, 0) == " Q pb, x="
    assert g.payoffs(play_moves(g, s, [" p"])) == (-1.0, 1.0)
    end = play_moves(g, s, [" call"])
    assert g.payoffs(end) == (-2.0, 2.0) and g.result_text(end, 0) == " loss, K" and g.result_text(end, 1) == " win, Q"
    assert isinstance(play_moves(g, q_vs_k, [" raise"]), Forfeit)
    assert [g.read(t) for t in ("1", " 0", "x=1", "I fold", "12", "bet or check")] == ["b", "p", "b", "p", None, "b"]
    deals = {g.initial(np.random.default_rng(i)).cards for i in range(100)}
    assert deals == {(a, b) for a in range(3) for b in range(3) if a != b}


def test_make_game():
    assert isinstance(make_game("nim"), Nim) and isinstance(make_game(KuhnPoker()), KuhnPoker)
    with pytest.raises(ValueError, match="unknown game 'chess'; known: kuhn, nim, tictactoe"):
        make_game("chess")


# -- the single-agent ids ------------------------------------------------------------------------------------------


def window_text(env, obs):
    ids = [i for i, m in zip(obs["input_ids"], obs["attention_mask"]) if m]
    return env.unwrapped.tokenizer.decode(ids, skip_special_tokens=True)


def play(env, moves, seed):
    """Play ``moves`` (texts) as the learner's turns; return (final reward, info, observations' texts)."""
    tok = env.unwrapped.tokenizer
    obs, _ = env.reset(seed=seed)
    seen = [window_text(env, obs)]
    for move in moves:
        for t in tok(move, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            obs, r, term, trunc, info = env.step(t)
            if term or trunc:
                return r, term, trunc, info, seen + [window_text(env, obs)]
        seen.append(window_text(env, obs))
    raise AssertionError("the game did not end")


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_game_ids_pass_both_env_checkers(env_id):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make(env_id).unwrapped
    assert isinstance(env.text_spec.interaction, SelfPlay)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gym_check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=False)


def test_tictactoe_against_the_heuristic_by_hand():
    env = gym.make("TicTacToe-v0", interaction=SelfPlay(TicTacToe(), "heuristic", learner_player=0))
    # every heuristic answer is forced: the centre, block 3, block 4, the last corner; the board fills up
    r, term, trunc, info, seen = play(env, [" 1", " 2", " 7", " 6", " 8"], seed=0)
    assert seen[0] == "Tic-tac-toe, you are x. ......... x="
    assert seen[1].endswith(" 1 x...o.... x=") and seen[2].endswith(" 2 xxo.o.... x=")
    assert seen[3].endswith(" 7 xxooo.x.. x=") and seen[4].endswith(" 6 xxoooxx.o x=")
    assert term and not trunc and r == 0.0 and info["turns"] == 5
    assert info["transcript"][-1]["text"] == " draw"
    # the learner wins from a fork: x1, o5, x9, o corner, ...: a loss to the heuristic is impossible here


def test_learner_plays_both_sides_and_an_illegal_move_loses():
    env = gym.make("Nim-v0")
    sides = set()
    for seed in range(12):
        obs, _ = env.reset(seed=seed)
        state = env.unwrapped._task_state
        sides.add(state["learner"])
        if state["learner"] == 1:  # the opponent already moved: the heap shown is after its take
            assert window_text(env, obs).endswith(f" {state['game'].heap} left, x=")
    assert sides == {0, 1}
    r, term, _, info, _ = play(env, [" 7"], seed=3)
    assert term and r == -1.0 and info["transcript"][-1]["text"] == " loss (illegal)"
    assert info["forfeit"] == "learner"
    r, term, _, info, _ = play(env, [" 1"] * 60, seed=3)  # legal moves to the end
    assert term and r in (-1.0, 1.0) and info["forfeit"] == ""
    env = gym.make("TicTacToe-v0", interaction=SelfPlay(TicTacToe(), lambda turn: " zz", learner_player=0))
    r, term, _, info, _ = play(env, [" 1"], seed=0)
    assert term and r == 1.0 and info["forfeit"] == "opponent"


def test_nim_heuristic_learner_beats_random_on_every_winnable_heap():
    class Optimal(Opponent):  # a stand-in learner: writes the heuristic's move
        pass

    env = gym.make("Nim-v0", interaction=SelfPlay(Nim(), "random", learner_player=0))
    g, wins = Nim(), []
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        tok = env.unwrapped.tokenizer
        heap = env.unwrapped._task_state["game"].heap
        while True:
            s = env.unwrapped._task_state["game"]
            move = g.heuristic(s, np.random.default_rng(0))
            done = False
            for t in tok(f" {move}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
                obs, r, term, trunc, _ = env.step(t)
                done = term or trunc
                if done:
                    break
            if done:
                break
        wins.append((heap % 4 != 0, r))
    assert all(r == 1.0 for winnable, r in wins if winnable) and len(wins) == 30


def test_opponent_sees_its_own_side_and_is_seeded():
    seen = []

    def first_legal(turn):
        seen.append((turn.player, turn.text))
        return turn.game.move_text(turn.game.legal(turn.state)[0])

    env = gym.make("TicTacToe-v0", interaction=SelfPlay(TicTacToe(), first_legal, learner_player=1))
    obs, _ = env.reset(seed=0)
    assert seen == [(0, "Tic-tac-toe, you are x. ......... x=")]
    assert window_text(env, obs).endswith(" o........ x=")  # the opponent's mark, from the learner's side
    r, term, *_ = play(env, [" 5", " 9", " 7"], seed=0)[:3]
    assert seen[-1][1].startswith("Tic-tac-toe, you are x. ......... x= 1 x...o.... x= 2")
    # the same seed replays the same random opponent
    env = gym.make("KuhnPoker-v0")
    a = [play(env, [" b", " b"], seed=s)[3]["transcript"] for s in range(8)]
    b = [play(env, [" b", " b"], seed=s)[3]["transcript"] for s in range(8)]
    assert a == b and len({str(t) for t in a}) > 1


def test_selfplay_bad_input():
    with pytest.raises(TypeError, match="game must be a textrl_envs.games Game"):
        SelfPlay("tictactoe")
    with pytest.raises(ValueError, match="learner_player must be 0"):
        SelfPlay(Nim(), learner_player=2)
    with pytest.raises(TypeError, match="opponent must be 'random', 'heuristic'"):
        SelfPlay(Nim(), opponent="strong")
    env = gym.make("Nim-v0", interaction=SelfPlay(Nim(), lambda turn: 3, learner_player=1))
    with pytest.raises(RuntimeError, match="must return the move as a str"):
        env.reset(seed=0)  # the opponent moves first, at the start


# -- PettingZoo -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("game", ["tictactoe", "nim", "kuhn"])
def test_pettingzoo_api_and_seed_tests(game):
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import api_test, seed_test

    from textrl_envs.games.aec import env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # api_test's advice that Dict observations are unusual
        api_test(env(game), num_cycles=200)
        seed_test(lambda: env(game), num_cycles=200)


def test_pettingzoo_game_by_hand():
    pytest.importorskip("pettingzoo")
    from textrl_envs.games.aec import env

    e = env("tictactoe")
    e.reset(seed=0)
    tok = e.tokenizer

    def text(agent):
        o = e.observe(agent)
        return tok.decode([i for i, m in zip(o["input_ids"], o["attention_mask"]) if m], skip_special_tokens=True)

    assert e.agent_selection == "player_0" and text("player_0") == "Tic-tac-toe, you are x. ......... x="
    assert text("player_1") == "Tic-tac-toe, you are x."
    for move in [" 1", " 5", " 2", " 4", " 3"]:  # x wins on the top row
        for t in tok(move, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
            e.step(t)
    # each window is the game from its own side: x its marks, o the other's
    assert text("player_0") == "Tic-tac-toe, you are x. ......... x= 1 x...o.... x= 2 xx.oo.... x= 3 win"
    assert text("player_1") == "Tic-tac-toe, you are x. o........ x= 5 oo..x.... x= 4 loss"
    assert all(e.terminations.values()) and e._cumulative_rewards == {"player_0": 1.0, "player_1": -1.0}


def test_pettingzoo_missing_extra_names_the_install(monkeypatch):
    import importlib

    from textrl_envs.games import aec

    real = importlib.import_module

    def no_pettingzoo(name, *args, **kwargs):
        if name == "pettingzoo":
            raise ImportError("No module named 'pettingzoo'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_pettingzoo)
    monkeypatch.setattr(aec, "_CLASS", [])
    with pytest.raises(ImportError, match=r'pip install "textrl\[games\]"'):
        aec.env("nim")


def game_of(env_id):
    return make_game({"TicTacToe-v0": "tictactoe", "Nim-v0": "nim", "KuhnPoker-v0": "kuhn"}[env_id])


@pytest.mark.parametrize("env_id", GAME_IDS)
def test_vector_env_equals_sync_vector_env_in_groups(env_id):
    """Group members share side, deal and opponent: a group of the vector env is SyncVectorEnv members given the
    group's seed (first episodes; later rounds are in the interactive tests' vector == SyncVectorEnv)."""
    from gymnasium.vector import AutoresetMode

    n, g = 4, 2
    game = game_of(env_id).name
    kw = {"interaction": SelfPlay(game_of(env_id), "heuristic")}
    vec = gym.make_vec(env_id, num_envs=n, device="cpu", group_size=g, **kw)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, **kw) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    ov, _ = vec.reset(seed=11)
    os_, _ = sync.reset(seed=[11, 11, 13, 13])  # group k is seeded seed + k * G
    np.testing.assert_array_equal(ov["input_ids"], os_["input_ids"])
    books = [e.unwrapped._task_state for e in sync.envs]
    assert books[0]["learner"] == books[1]["learner"] and books[0]["game"] == books[1]["game"]
    tok = vec.tokenizer
    moves = tok(" 1 2 3 5 7 9 b p", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] * 4
    rng, live, ended = np.random.default_rng(0), np.ones(n, dtype=bool), 0
    for _ in range(80):
        actions = rng.choice(moves, size=n)
        ov, rv, tv, uv, iv = vec.step(actions)
        os_, rs, ts, us, is_ = sync.step(actions)
        np.testing.assert_array_equal(rv[live], rs[live])
        np.testing.assert_array_equal(tv[live], ts[live])
        for i in np.flatnonzero(live & tv):
            assert iv["final_info"]["transcript"][i] == is_["final_info"]["transcript"][i]
            for key in ("learner_player", "game", "opponent"):  # the side played, for role-conditioned advantages
                assert iv["final_info"][key][i] == is_["final_info"][key][i]
            assert iv["final_info"]["learner_player"][i] == books[i]["learner"] and iv["final_info"]["game"][i] == game
            ended += 1
        live &= ~(tv | uv)
        if not live.any():
            break
    assert ended == n
