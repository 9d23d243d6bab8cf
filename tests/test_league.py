"""Self-play with a league: Elo by hand, sampling, frozen snapshots, the callback, LM opponents."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch as th

import textrl_envs  # noqa: F401  (registers the ids)
from sb3_grpo.callbacks.league import League, LeagueCallback, elo_expected, elo_update, match_score
from textrl_envs.games import Nim, OpponentTurn, PolicyOpponent, RandomOpponent, SelfPlay, TicTacToe
from textrl_envs.sb3 import make_vec_env

# -- Elo, by hand ------------------------------------------------------------------------------------------------


def test_elo_update_matches_a_hand_computation():
    # A (1000) beats B (1200): E_A = 1 / (1 + 10 ** 0.5) = 0.2402530733; K (1 - E_A) = 32 * 0.7597469267
    assert elo_expected(1000, 1200) == pytest.approx(0.2402530733)
    a, b = elo_update(1000, 1200, 1.0)
    assert a == pytest.approx(1024.3119016) and b == pytest.approx(1175.6880984)
    assert elo_update(1500, 1500, 0.5) == (1500, 1500)  # a draw between equals moves nothing
    assert elo_update(1500, 1500, 0.0, k=16) == (1492, 1508)
    assert elo_expected(1200, 1000) + elo_expected(1000, 1200) == pytest.approx(1.0)
    assert [match_score(r) for r in (2.0, 0.0, -1.0)] == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match=r"score_a must be in \[0, 1\]"):
        elo_update(1000, 1000, 2.0)


# -- the league --------------------------------------------------------------------------------------------------


def test_league_sampling_and_ratings():
    league = League(sampling="latest", fixed={"random": "random", "heuristic": "heuristic"})
    assert [m.name for m in league.members] == ["random", "heuristic"]
    rng = np.random.default_rng(0)
    assert all(league.pick(rng) is league.members[-1].opponent for _ in range(20))
    league.sampling = "uniform"
    first = sum(league.pick(rng) is league.members[0].opponent for _ in range(2000))
    assert abs(first - 1000) < 120
    # a result moves the learner's and that member's ratings as elo_update says
    heuristic = league.members[1]
    league.record(heuristic.opponent, -1.0, 0)
    a, b = elo_update(1000, 1000, 0.0)
    assert league.learner_rating == a and heuristic.rating == b and league.members[0].rating == 1000
    assert (heuristic.games, heuristic.learner_wins) == (1, 0) and league.results == [("heuristic", -1.0, 0)]
    # by rating: the stronger member (the heuristic, now above the learner) is drawn more often
    league.sampling = "rating"
    w = league.weights()
    expected = np.array([elo_expected(1000, a), elo_expected(b, a)])
    np.testing.assert_allclose(w, expected / expected.sum())
    assert w[1] > w[0]
    # the same generator state picks the same member (group members and seeded episodes agree)
    picks = [league.pick(np.random.default_rng(s)) for s in range(10)]
    assert picks == [league.pick(np.random.default_rng(s)) for s in range(10)]


def test_league_bad_input():
    with pytest.raises(ValueError, match="sampling must be one of latest, uniform, rating"):
        League(sampling="best")
    with pytest.raises(RuntimeError, match="the league has no members yet"):
        League().pick(np.random.default_rng(0))
    with pytest.raises(ValueError, match="already has a member named 'random'"):
        League(fixed={"random": "random"}).add(RandomOpponent(), name="random")
    with pytest.raises(TypeError, match="league must be a League"):
        LeagueCallback("league")


# -- snapshots are frozen copies; the callback keeps the league -------------------------------------------------------


def _model(league, n_envs=4, group_size=2, advantage="group", **kwargs):
    from helpers import quiet

    from sb3_grpo import GRPO

    env = make_vec_env("TicTacToe-v0", n_envs=n_envs, group_size=group_size, seed=0, device="cpu",
                       interaction=SelfPlay(TicTacToe(), league))  # fmt: skip
    hp = {"n_steps": 12, "batch_size": 16, "n_epochs": 1, "learning_rate": 1e-2, "seed": 0, "device": "cpu"}
    return quiet(GRPO("CausalLMPolicy", env, advantage=advantage, **hp, **kwargs))


def test_snapshots_are_frozen_and_the_opponent_never_trains():
    from helpers import RolloutLog

    league = League(sampling="uniform", fixed={"random": "random"}, max_snapshots=2)
    model = _model(league, advantage="gae")  # a value loss: the learner's weights move on every update
    log = RolloutLog()
    model.learn(12 * 4 * 3, callback=[LeagueCallback(league, snapshot_every=1), log])
    snaps = [m for m in league.members if m.snapshot]
    assert [m.name for m in snaps] == ["snapshot_1", "snapshot_2"] and league.snapshots == 3  # the oldest dropped
    first = snaps[0].opponent.policy
    frozen = {k: v.clone() for k, v in first.state_dict().items()}
    assert all(not p.requires_grad for p in first.parameters()) and not first.training
    optimized = {id(p) for group in model.policy.optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in first.parameters()}
    logged, rating = log.values[-1], league.learner_rating
    assert logged["league/size"] == 3 and logged["league/learner_rating"] == rating
    assert "league/rating/random" in logged and logged["league/games"] > 0
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    model.learn(12 * 4, reset_num_timesteps=False)  # the learner trains on; the snapshot stays as it was
    assert any(not th.equal(before[k], v) for k, v in model.policy.state_dict().items())
    assert all(th.equal(frozen[k], v) for k, v in first.state_dict().items())
    assert league.results and all(name in ("random", "snapshot_0", "snapshot_1", "snapshot_2", "(dropped)")
                                  for name, _, _ in league.results)  # fmt: skip


def test_a_snapshots_prefill_memo_is_kept_small(monkeypatch):
    """A frozen copy's parameters never change, so no update empties its prefill memo: it gets a small budget of its
    own, not the learner's (for SmolLM2-135M in float32 the learner's is about 750 MB a policy, which a league of
    snapshots of a real model would each fill with game conversations)."""
    from transformers import LlamaConfig

    import sb3_grpo.policies.causal_lm as causal_lm
    from sb3_grpo.policies.prefill_memo import FROZEN_MEMO_BYTES, memo_budget

    smollm2 = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3)
    assert memo_budget(smollm2, 4) == 2 * 30 * 3 * 64 * 4 * 16_384 > 10 * FROZEN_MEMO_BYTES
    model = _model(League(fixed={"random": "random"}))
    assert model.policy.frozen_copy()._rollout_cache.memo.max_bytes == FROZEN_MEMO_BYTES
    budget = 320 * 1024  # two or three of the bundled LM's game windows: the memo must evict to stay within it
    monkeypatch.setattr(causal_lm, "FROZEN_MEMO_BYTES", budget)
    opponent = PolicyOpponent.snapshot(model.policy, name="frozen")
    memo = opponent.policy._rollout_cache.memo
    vec = gym.make_vec("TicTacToe-v0", num_envs=8, device="cpu", interaction=SelfPlay(TicTacToe(), opponent))
    vec.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(40):
        vec.step(rng.integers(0, vec.single_action_space.n, size=8))
    assert memo.max_bytes == budget and 0 < memo._bytes <= budget


def test_group_members_play_the_same_opponent():
    league = League(sampling="uniform", fixed={"random": "random", "heuristic": "heuristic", "r2": RandomOpponent()})
    vec = gym.make_vec(
        "TicTacToe-v0", num_envs=8, group_size=2, device="cpu", interaction=SelfPlay(TicTacToe(), league)
    )
    vec.reset(seed=5)
    states = vec.unwrapped._turn_book.states  # each row's episode state
    for k in range(4):
        a, b = states[2 * k], states[2 * k + 1]
        assert a["opponent"] is b["opponent"] and a["learner"] == b["learner"] and a["game"] == b["game"]
    assert len({id(s["opponent"]) for s in states}) > 1  # the groups drew different opponents


# -- an LM policy as the opponent ----------------------------------------------------------------------------------


def test_policy_opponent_batches_like_one_at_a_time_and_is_seeded():
    league = League(fixed={"random": "random"})
    model = _model(league)
    opp = PolicyOpponent.snapshot(model.policy, max_turn_tokens=3)
    game = TicTacToe()
    state = game.play(game.initial(None), 5)
    texts = ["Tic-tac-toe, you are x. ....o.... x=", "Tic-tac-toe, you are x. ......... x= 5 o...x.... x="]

    def turns(seed):
        return [OpponentTurn(game, state, 1, t, np.random.default_rng(seed + i)) for i, t in enumerate(texts)]

    batched = opp.moves(turns(0))
    alone = [opp.moves([t])[0] for t in turns(0)]
    assert batched == alone and batched == opp.moves(turns(0))
    assert all(isinstance(m, str) for m in batched)
    greedy = PolicyOpponent(opp.policy, max_turn_tokens=3, deterministic=True)
    assert greedy.moves(turns(0)) == greedy.moves(turns(7))  # greedy ignores the generator
    with pytest.raises(TypeError, match="needs a policy with get_distribution"):
        PolicyOpponent(object())


def test_lm_opponent_plays_in_the_env():
    league = League(fixed={"random": "random"})
    model = _model(league)
    opp = PolicyOpponent.snapshot(model.policy, deterministic=True)
    env = gym.make("TicTacToe-v0", interaction=SelfPlay(TicTacToe(), opp, learner_player=1))
    obs, _ = env.reset(seed=0)
    tok = env.unwrapped.tokenizer
    _, r, term, trunc, info = env.step(tok.eos_token_id)  # an empty move loses, or the LM's illegal first move won
    assert term and info["transcript"][1]["text"].startswith(" ")
    assert r in (-1.0, 1.0)


class ScriptedPolicy:
    """A stand-in LM: its distribution puts all mass on the next token of ``script`` (and records what it read)."""

    def __init__(self, script, vocab, width=72):
        from gymnasium import spaces

        self.script, self.vocab, self.calls, self.read = list(script), vocab, 0, []
        self.observation_space = spaces.Dict({"input_ids": spaces.Box(0, vocab - 1, (width,), np.int64)})
        self.device = th.device("cpu")

    def get_distribution(self, obs):
        self.read.append(obs["input_ids"].clone())
        probs = th.zeros(obs["input_ids"].shape[0], self.vocab)
        probs[:, self.script[self.calls % len(self.script)]] = 1.0
        self.calls += 1
        return type("D", (), {"distribution": th.distributions.Categorical(probs=probs)})()


def test_lm_opponent_reads_the_tokens_a_learner_in_its_seat_sees():
    env = gym.make("Nim-v0", interaction=SelfPlay(Nim(), "random", learner_player=1))
    tok = env.unwrapped.tokenizer
    one, eos = tok("1", add_special_tokens=False)["input_ids"][0], tok.eos_token_id
    policy = ScriptedPolicy([one, eos], len(tok))
    env = gym.make("Nim-v0", interaction=SelfPlay(Nim(), PolicyOpponent(policy), learner_player=1))
    env.reset(seed=0)  # the opponent (player 0) writes "1" and EOS
    for t in tok(" 1", add_special_tokens=False)["input_ids"] + [eos]:
        env.step(t)
    # its second move: it read its first board, its own "1" and EOS, then the board after the learner's take
    second = [i for i in policy.read[2][0].tolist() if i != tok.pad_token_id]
    first_board = tok("Nim, take 1-3.", add_special_tokens=False)["input_ids"]
    assert second[: len(first_board)] == first_board
    text = tok.decode(second, skip_special_tokens=False)
    assert " left, x=1<|endoftext|> " in text and text.endswith(" left, x=")
    assert second.count(eos) == 1
    assert policy.calls == 4  # one forward pass per token: two moves of "1" and EOS


@pytest.mark.parametrize("deterministic", [False, True])
def test_policy_opponent_on_the_kv_cache_writes_the_moves_of_the_recompute_path(deterministic):
    """The same games (same seeds, same learner actions) against the opponent decoding on its KV cache and against
    the one recomputing every window: the same transcripts, move for move; windows long enough to slide mid-move
    take the recompute path on the cache engine too."""
    model = _model(League(fixed={"random": "random"}))
    frozen = PolicyOpponent.snapshot(model.policy, max_turn_tokens=3, deterministic=deterministic)
    assert frozen.engine == "cache"
    played = {}
    for engine in ("cache", "recompute"):
        opp = PolicyOpponent(frozen.policy, max_turn_tokens=3, deterministic=deterministic, engine=engine)
        vec = gym.make_vec("TicTacToe-v0", num_envs=6, device="cpu", interaction=SelfPlay(TicTacToe(), opp))
        vec.reset(seed=3)
        tok, rng, games = vec.tokenizer, np.random.default_rng(0), []
        digits = tok(" 1 2 3 4 5 6 7 8 9", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] * 3
        for _ in range(60):
            *_, term, trunc, infos = vec.step(rng.choice(digits, size=6))
            games += [infos["final_info"]["transcript"][i] for i in np.flatnonzero(term | trunc)]
        played[engine] = games
    assert len(played["cache"]) > 10 and played["cache"] == played["recompute"]
    # a conversation too long for the window to hold the move without sliding: recomputed, as the reference does
    game = TicTacToe()
    long_text = "Tic-tac-toe, you are x." + " ......... x= 5 o...x.... x=" * 8
    turn = [OpponentTurn(game, game.initial(None), 0, long_text, np.random.default_rng(1))]
    cached = PolicyOpponent(frozen.policy, max_turn_tokens=3, engine="cache").moves(turn)
    turn = [OpponentTurn(game, game.initial(None), 0, long_text, np.random.default_rng(1))]
    assert cached == PolicyOpponent(frozen.policy, max_turn_tokens=3, engine="recompute").moves(turn)
    with pytest.raises(ValueError, match="engine='cache' needs a policy with the built-in decoder"):
        PolicyOpponent(ScriptedPolicy([0], 10), engine="cache")
    with pytest.raises(ValueError, match="engine must be one of auto, cache, recompute"):
        PolicyOpponent(frozen.policy, engine="kv")


def test_lora_snapshots_share_the_base_and_keep_their_adapters():
    """A league of LoRA snapshots holds one base: a snapshot's frozen base weights are the learner's own tensors, its
    adapters and value head its own copies; it plays as the learner played when it was taken, however the learner
    trains on, and exactly like a full copy (the older path) does."""
    from helpers import TINY_LORA

    from textrl_envs.games.policy import copy_policy

    pytest.importorskip("peft", reason='LoRA snapshots need peft: pip install "textrl[lora]"')
    league = League(fixed={"random": "random"})
    model = _model(league, advantage="gae", policy_kwargs={"lora": TINY_LORA})  # gae: every update moves it
    learner = model.policy
    snap = PolicyOpponent.snapshot(learner, max_turn_tokens=3)
    frozen = snap.policy
    base = {n: p for n, p in learner.named_parameters() if not p.requires_grad}
    mine = dict(frozen.named_parameters())
    assert base and all(mine[n].data_ptr() == p.data_ptr() for n, p in base.items())  # shared, not copied
    trainable = [n for n, p in learner.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable)
    assert all(mine[n].data_ptr() != dict(learner.named_parameters())[n].data_ptr() for n in trainable)
    assert frozen.optimizer is None and not frozen.training and not any(p.requires_grad for p in mine.values())
    rebuilt = type(learner)(**learner._get_constructor_parameters())  # the older path: a whole new policy
    rebuilt.load_state_dict(learner.state_dict())
    rebuilt.set_training_mode(False)
    full = PolicyOpponent(rebuilt, max_turn_tokens=3)
    game = TicTacToe()
    state = game.play(game.initial(None), 5)
    text = "Tic-tac-toe, you are x. ....o.... x="

    def moves(opp, seed=3):
        return opp.moves([OpponentTurn(game, state, 1, text, np.random.default_rng(seed + i)) for i in range(4)])

    taken = moves(snap)
    assert taken == moves(full)
    model.learn(12 * 4, reset_num_timesteps=False)  # the learner's adapters move on
    assert any(not th.equal(p, mine[n]) for n, p in learner.named_parameters() if "lora_" in n)
    assert moves(snap) == taken
    assert copy_policy(learner).optimizer is None  # copy_policy takes the policy's own frozen copy


@pytest.mark.parametrize("reply_prefix", [None, ""], ids=["game-prefix", "no-prefix"])
def test_a_chat_opponent_reads_its_side_as_chat_messages_and_writes_free_text(tmp_path, reply_prefix):
    """In chat mode an LM opponent reads its own side of the game as chat messages (the rules and each board as user
    messages, its moves as assistant messages) rendered with the chat template and the game's reply prefix (none
    with ``reply_prefix=""``), stops at the end-of-turn token, and its free-text move is read as a chat learner's
    is."""
    import re

    from helpers import chat_tokenizer_folder
    from transformers import AutoTokenizer

    from textrl_envs.games.nim import NimState

    folder = chat_tokenizer_folder(tmp_path / "chat")
    tok = AutoTokenizer.from_pretrained(folder)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    game = Nim()
    prefix = game.chat_reply_prefix if reply_prefix is None else reply_prefix
    assert prefix in ("I take", "")
    said = " 2 stones." if prefix else " I take 2 stones."  # the move as the opponent writes it after the prefix
    move = tok(said, add_special_tokens=False)["input_ids"]
    policy = ScriptedPolicy([*move, end], len(tok), width=256)  # room for both turns of the conversation
    opponent = PolicyOpponent(policy, tokenizer=folder, max_turn_tokens=24, chat=True, name="chatty")
    assert opponent.turn_end[0] == end
    play = SelfPlay(game, opponent, learner_player=1, chat=True, reply_prefix=reply_prefix)
    env = gym.make("Nim-v0", tokenizer=folder, instruct=True, interaction=play)
    obs, _ = env.reset(seed=0)
    calls = policy.calls
    assert calls == len(move) + 1  # one token per call, the end-of-turn token last
    first = tok.decode([i for i in policy.read[0][0].tolist() if i != tok.pad_token_id])
    heap = int(re.search(r"There are (\d+) stones left", first).group(1))
    board = game.chat_render(NimState(heap, 0), 0)
    want = tok.apply_chat_template([{"role": "user", "content": f"{game.chat_intro}\n\n{board}"}],
                                   add_generation_prompt=True, tokenize=False)  # fmt: skip
    assert first == want + prefix
    # the learner's window ends with the generation prompt and the prefix too: its move is the text after it
    seen = tok.decode([i for i, m in zip(obs["input_ids"].tolist(), obs["attention_mask"].tolist()) if m])
    assert seen.endswith("<|im_start|>assistant\n" + prefix)
    # the learner answers; the opponent's second turn reads its first move back as an assistant message
    for t in tok(" 1." if prefix else " I take 1.", add_special_tokens=False)["input_ids"] + [end]:
        env.step(t)
    second = tok.decode([i for i in policy.read[calls][0].tolist() if i != tok.pad_token_id])
    assert second.startswith(want) and f"<|im_start|>assistant\n{prefix}{said}<|im_end|>" in second
    assert second.count("<|im_start|>user") == 2 and second.endswith("<|im_start|>assistant\n" + prefix)
    # both moves landed: 2 stones taken by the opponent (read from its free text), 1 by the learner
    assert f"There are {heap - 3} stones left" in second.rsplit("<|im_start|>user", 1)[1]
    # a chat opponent in a game that is not in chat mode is refused with what to do
    with pytest.raises(ValueError, match="speaks chat, but this game is not in chat mode.*chat=True"):
        SelfPlay(Nim(), PolicyOpponent(policy, chat=True, tokenizer=folder))
    # one that meets a game in text mode through a league: refused when it is to move, saying what to do
    turn = OpponentTurn(game, NimState(5, 0), 0, "Nim, take 1-3.", np.random.default_rng(0))
    with pytest.raises(ValueError, match="speaks chat.*no chat messages.*SelfPlay\\(..., chat=True\\)"):
        opponent.moves([turn])
