"""TextGenVectorEnv: same semantics as N single envs, prompt groups, backends, memory, bad input.

Everything here runs offline with a tiny word-level tokenizer built in the test, so it does not wait
for the bundled assets or the task suite.
"""

from __future__ import annotations

from collections import defaultdict

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from helpers import EOS, PROMPTS, bundled_assets, length_reward, register_test_id, word_tokenizer

from textrl_envs.bookkeeping import (
    append_tokens,
    append_tokens_,
    completion_bounds,
    completion_tuples,
    episode_ends,
    episode_ids,
    group_ids,
    pack_prompts,
    start_windows_,
)
from textrl_envs.devices import resolve_device
from textrl_envs.vector import TextGenVectorEnv

TEST_ID = "TextRLTest/TinyVector-v0"


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


@pytest.fixture(scope="module")
def kw(tokenizer):
    register_test_id(TEST_ID)
    return dict(prompts=PROMPTS, reward=length_reward, tokenizer=tokenizer, max_new_tokens=7, max_prompt_tokens=5)


def biased_actions(rng: np.random.Generator, n: int, vocab: int, step: int) -> np.ndarray:
    """Random tokens; env j emits EOS with probability (j + 1) / (2n + 2), so episodes end at different times."""
    a = rng.integers(3, vocab, size=n)
    eos = rng.random(n) < (np.arange(n) + 1) / (2 * n + 2)
    a[eos] = EOS
    if step % 13 == 0:  # now and then a pad / unk token, which decode drops
        a[rng.integers(n)] = rng.integers(0, 3)
    return a


# -- the pure bookkeeping ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["numpy", "torch"])
def test_in_place_append_equals_the_pure_one(path):
    from textrl_envs.bookkeeping import _append_tokens_torch

    rng = np.random.default_rng(0)
    ids = torch.as_tensor(rng.integers(0, 50, (7, 6)))
    mask = torch.as_tensor(rng.integers(0, 2, (7, 6)))
    for _ in range(8):  # repeated shifts: rows never leak into one another
        tokens = torch.as_tensor(rng.integers(0, 50, 7))
        want_ids, want_mask = append_tokens(ids, mask, tokens)
        if path == "torch":  # the path of other devices, on CPU tensors
            _append_tokens_torch(ids, mask, tokens)
        else:
            append_tokens_(ids, mask, tokens, tokens.numpy().copy() if rng.random() < 0.5 else None)
        assert torch.equal(ids, want_ids) and torch.equal(mask, want_mask)
    with pytest.raises(ValueError, match="contiguous"):
        append_tokens_(ids.t(), mask.t(), tokens)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_pure_functions(backend, monkeypatch):
    if backend == "torch":  # the path other devices take, run on CPU tensors
        from textrl_envs import bookkeeping

        monkeypatch.setattr(
            bookkeeping,
            "_start_windows_numpy",
            lambda *a: bookkeeping._start_windows_torch(*map(torch.as_tensor, a[:6]), a[6]),
        )
    ids, mask = pack_prompts([np.array([5, 6]), np.array([7, 8, 9])], width=3, pad_token_id=0)
    assert ids.tolist() == [[0, 5, 6], [7, 8, 9]] and mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    w_ids = torch.full((4, 5), 9, dtype=torch.int64)
    w_mask = torch.ones((4, 5), dtype=torch.int64)
    start_windows_(
        w_ids, w_mask, torch.tensor([0, 1, 3]), torch.tensor([1, 0, 0]), torch.as_tensor(ids), torch.as_tensor(mask), 0
    )
    assert w_ids.tolist() == [[0, 0, 7, 8, 9], [0, 0, 0, 5, 6], [9] * 5, [0, 0, 0, 5, 6]]
    assert w_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [1] * 5, [0, 0, 0, 1, 1]]
    f_ids, f_mask = pack_prompts([np.array([5, 6]), np.array([7, 8, 9])], width=5, pad_token_id=0)
    w2_ids, w2_mask = torch.full((4, 5), 9, dtype=torch.int64), torch.ones((4, 5), dtype=torch.int64)
    start_windows_(
        w2_ids,
        w2_mask,
        torch.tensor([0, 1, 3]),
        torch.tensor([1, 0, 0]),
        torch.as_tensor(f_ids),
        torch.as_tensor(f_mask),
        0,
    )
    assert w2_ids.tolist() == w_ids.tolist() and w2_mask.tolist() == w_mask.tolist()  # full-width table: same rows
    w_ids, w_mask = w_ids[:2], w_mask[:2]
    n_ids, n_mask = append_tokens(w_ids[:2], w_mask[:2], torch.tensor([4, 3]))
    assert n_ids.tolist() == [[0, 7, 8, 9, 4], [0, 0, 5, 6, 3]]
    assert n_mask.tolist() == [[0, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    starts, stops = completion_bounds(5, np.array([1, 3]), np.array([True, False]))
    assert starts.tolist() == [4, 2] and stops.tolist() == [4, 5]
    assert completion_tuples(n_ids.numpy(), starts, stops) == [(), (5, 6, 3)]
    assert completion_tuples(n_ids.numpy()[:0], starts[:0], stops[:0]) == []
    term, trunc = episode_ends(np.array([1, 1, 4, 4]), np.array([1, 3, 3, 2]), 1, 3)
    assert term.tolist() == [True, True, False, False] and trunc.tolist() == [False, False, True, False]
    term, trunc = episode_ends(np.array([1, 4]), np.array([3, 1]), None, 3)
    assert term.tolist() == [False, False] and trunc.tolist() == [True, False]
    rounds = np.array([0, 0, 2, 1, 0, 5])
    assert episode_ids(rounds, 6).tolist() == [0, 1, 14, 9, 4, 35]
    assert group_ids(rounds, 2).tolist() == [0, 0, 7, 4, 2, 17]
    assert (group_ids(rounds, 3) == episode_ids(rounds, 6) // 3).all()


def test_numpy_block_draws_equal_one_by_one_draws():
    """The vector env draws prompts DRAW_BLOCK at a time; numpy must give the single env's sequence."""
    for n in (1, 2, 5, 7, 64, 1000, 2**33 + 5):
        a, _ = seeding.np_random(3)
        b, _ = seeding.np_random(3)
        one_by_one = [int(a.integers(n)) for _ in range(150)]
        blocks = b.integers(n, size=64).tolist() + b.integers(n, size=64).tolist() + b.integers(n, size=22).tolist()
        assert one_by_one == blocks and int(a.integers(n)) == int(b.integers(n))


# -- same semantics as N single envs ----------------------------------------------------------------


def _assert_obs_equal(a, b):
    for key in ("input_ids", "attention_mask"):
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


@pytest.mark.parametrize("num_envs,seed", [(6, 7), (3, 123)])
def test_matches_sync_vector_env(kw, num_envs, seed):
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(TEST_ID, **kw) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    vec = gym.make_vec(TEST_ID, num_envs=num_envs, device="cpu", **kw)
    assert isinstance(vec, TextGenVectorEnv)
    assert vec.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert vec.single_observation_space == sync.single_observation_space
    assert vec.single_action_space == sync.single_action_space

    obs_s, info_s = sync.reset(seed=seed)
    obs_v, info_v = vec.reset(seed=seed)
    _assert_obs_equal(obs_s, obs_v)
    assert list(info_v["prompt"]) == list(info_s["prompt"])
    np.testing.assert_array_equal(info_v["prompt_index"], info_s["prompt_index"])

    rng = np.random.default_rng(seed)
    vocab = vec.single_action_space.n
    ended = {"terminated": 0, "truncated": 0, "staggered": 0}
    for step in range(1, 301):
        actions = biased_actions(rng, num_envs, vocab, step)
        obs_s, rew_s, term_s, trunc_s, info_s = sync.step(actions)
        obs_v, rew_v, term_v, trunc_v, info_v = vec.step(actions)
        _assert_obs_equal(obs_s, obs_v)
        np.testing.assert_array_equal(rew_v, rew_s)
        np.testing.assert_array_equal(term_v, term_s)
        np.testing.assert_array_equal(trunc_v, trunc_s)
        assert rew_v.dtype == np.float64 and term_v.dtype == np.bool_ and trunc_v.dtype == np.bool_
        done = term_s | trunc_s
        ended["terminated"] += int(term_s.sum())
        ended["truncated"] += int(trunc_s.sum())
        ended["staggered"] += int(0 < done.sum() < num_envs)
        if done.any():
            np.testing.assert_array_equal(info_v["_final_obs"], info_s["_final_obs"])
            fi_s, fi_v = info_s["final_info"], info_v["final_info"]
            for i in np.flatnonzero(done):
                _assert_obs_equal(info_s["final_obs"][i], info_v["final_obs"][i])
                for key in ("prompt", "completion", "prompt_index", "reward"):
                    assert fi_v[key][i] == fi_s[key][i], key
                assert list(fi_v["completion_ids"][i]) == list(fi_s["completion_ids"][i])
                assert info_v["prompt"][i] == info_s["prompt"][i]  # the new episode's reset info
                assert info_v["prompt_index"][i] == info_s["prompt_index"][i]
        else:
            assert "final_obs" not in info_v and "final_info" not in info_v
    # the run exercised both ends and envs finishing at different times
    assert ended["terminated"] > 20 and ended["truncated"] > 20 and ended["staggered"] > 20
    sync.close()
    vec.close()


@pytest.mark.skipif(not bundled_assets(), reason="bundled tokenizer not built yet")
@pytest.mark.parametrize(
    "env_id", ["TextGen-v0", "Arithmetic-v0", "IncreasingNumbers-v0", "CommonGen-v0", "Keywords-v0"]
)
def test_registered_ids_match_sync_vector_env(env_id):
    import textrl_envs  # noqa: F401  (registers the ids)

    n = 4
    vec = gym.make_vec(env_id, num_envs=n, device="cpu")
    assert isinstance(vec, TextGenVectorEnv)
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    _assert_obs_equal(sync.reset(seed=5)[0], vec.reset(seed=5)[0])
    rng = np.random.default_rng(5)
    eos, vocab = vec.text_spec.eos_token_id, vec.single_action_space.n
    finished = 0
    for _ in range(50):
        actions = rng.integers(0, vocab, n)
        actions[rng.random(n) < 0.15] = eos
        obs_s, rew_s, term_s, trunc_s, info_s = sync.step(actions)
        obs_v, rew_v, term_v, trunc_v, info_v = vec.step(actions)
        _assert_obs_equal(obs_s, obs_v)
        np.testing.assert_allclose(rew_v, rew_s, rtol=1e-6, atol=1e-9)  # a batched reward model may round differently
        np.testing.assert_array_equal(term_v, term_s)
        np.testing.assert_array_equal(trunc_v, trunc_s)
        for i in np.flatnonzero(term_s | trunc_s):
            assert info_v["final_info"]["completion"][i] == info_s["final_info"]["completion"][i]
            finished += 1
    assert finished >= n


def test_reset_without_seed_continues_rngs_like_sync(kw):
    sync = gym.vector.SyncVectorEnv(
        [lambda: gym.make(TEST_ID, **kw) for _ in range(4)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    vec = TextGenVectorEnv(num_envs=4, device="cpu", **kw)
    sync.reset(seed=[3, 1, 4, 1])
    vec.reset(seed=[3, 1, 4, 1])
    for _ in range(3):
        obs_s, _ = sync.reset()
        obs_v, _ = vec.reset()
        _assert_obs_equal(obs_s, obs_v)


def test_torch_backend_matches_numpy(kw):
    dev = resolve_device("auto")
    a = TextGenVectorEnv(num_envs=4, device=dev, obs_backend="torch", **kw)
    b = TextGenVectorEnv(num_envs=4, device="cpu", **kw)
    obs_a, _ = a.reset(seed=1)
    obs_b, _ = b.reset(seed=1)
    rng = np.random.default_rng(0)
    for step in range(40):
        for key in ("input_ids", "attention_mask"):
            assert isinstance(obs_a[key], torch.Tensor) and obs_a[key].device.type == dev.type
            assert obs_a[key].dtype == torch.int64
            np.testing.assert_array_equal(obs_a[key].cpu().numpy(), obs_b[key])
        actions = biased_actions(rng, 4, a.single_action_space.n, step)
        obs_a, ra, _, _, ia = a.step(torch.as_tensor(actions, device=dev))  # actions may live on the device
        obs_b, rb, _, _, ib = b.step(actions)
        np.testing.assert_array_equal(ra, rb)
        if "final_obs" in ia:
            i = int(np.flatnonzero(ia["_final_obs"])[0])
            assert isinstance(ia["final_obs"][i]["input_ids"], torch.Tensor)
            np.testing.assert_array_equal(
                ia["final_obs"][i]["input_ids"].cpu().numpy(), ib["final_obs"][i]["input_ids"]
            )


def test_narrow_prompt_table_matches_full_width(kw, monkeypatch):
    wide = TextGenVectorEnv(num_envs=4, device="cpu", **kw)
    monkeypatch.setattr("textrl_envs.vector.FULL_WIDTH_TABLE_MAX", 0)  # as for a large prompt set
    narrow = TextGenVectorEnv(num_envs=4, device="cpu", **kw)
    assert wide._packed_ids.shape[1] == 12 and narrow._packed_ids.shape[1] == 5
    obs_w, _ = wide.reset(seed=2, options={"prompt": "good fun plot"})
    obs_n, _ = narrow.reset(seed=2, options={"prompt": "good fun plot"})
    rng = np.random.default_rng(2)
    for step in range(60):
        _assert_obs_equal(obs_w, obs_n)
        actions = biased_actions(rng, 4, wide.single_action_space.n, step)
        obs_w, *_ = wide.step(actions)
        obs_n, *_ = narrow.step(actions)


def test_observation_dtype_shape_and_space(kw):
    vec = TextGenVectorEnv(num_envs=5, device="cpu", **kw)
    obs, _ = vec.reset(seed=0)
    w = kw["max_prompt_tokens"] + kw["max_new_tokens"]
    for key in ("input_ids", "attention_mask"):
        assert isinstance(obs[key], np.ndarray) and obs[key].dtype == np.int64 and obs[key].shape == (5, w)
    assert obs in vec.observation_space
    before = obs["input_ids"].copy()
    obs2, *_ = vec.step(np.full(5, 4))
    np.testing.assert_array_equal(obs["input_ids"], before)  # returned arrays are not views of the state
    assert obs2 in vec.observation_space
    assert vec.action_space.shape == (5,)


def test_reward_called_once_per_step_with_the_batch(kw):
    calls = []

    def counting(_prompts, completions, **_metadata):
        calls.append(len(completions))
        return [0.0] * len(completions)

    vec = TextGenVectorEnv(num_envs=8, device="cpu", **dict(kw, reward=counting))
    vec.reset(seed=0)
    for _ in range(kw["max_new_tokens"]):
        vec.step(np.full(8, 5))
    assert calls == [8]  # all 8 truncate on the same step: one call
    calls.clear()
    _, _, term, _, _ = vec.step(np.array([EOS, EOS, EOS, 5, 5, 5, 5, 5]))
    assert calls == [3] and term.sum() == 3


def test_reset_options_prompt(kw):
    vec = TextGenVectorEnv(num_envs=4, group_size=2, device="cpu", **kw)
    obs, info = vec.reset(seed=0, options={"prompt": "good fun plot"})
    assert list(info["prompt"]) == ["good fun plot"] * 4 and list(info["prompt_index"]) == [-1] * 4
    ids = vec.tokenizer("good fun plot", add_special_tokens=False)["input_ids"]
    assert (obs["input_ids"][:, -3:] == ids).all() and (obs["attention_mask"].sum(1) == 3).all()
    for _ in range(kw["max_new_tokens"]):
        _, rew, _, trunc, info = vec.step(np.full(4, 4))
    assert trunc.all() and list(info["final_info"]["prompt_index"]) == [-1] * 4
    assert list(info["final_info"]["prompt"]) == ["good fun plot"] * 4
    assert rew[0] == pytest.approx(length_reward(["good fun plot"], ["the " * 7])[0])
    assert all(p in PROMPTS for p in info["prompt"])  # later episodes draw from the prompt list again
    _, info = vec.reset(options={"prompt": PROMPTS[2]})  # a listed prompt keeps its index
    assert list(info["prompt_index"]) == [2] * 4
    _, info = vec.reset(options={"prompt_index": 3})
    assert list(info["prompt"]) == [PROMPTS[3]] * 4


def test_render_ansi(kw):
    vec = TextGenVectorEnv(num_envs=2, device="cpu", render_mode="ansi", **kw)
    vec.reset(seed=0, options={"prompt_index": 0})
    vec.step(np.array([3, 4]))
    assert vec.render() == ("the movie was|the", "the movie was|movie")


# -- groups -----------------------------------------------------------------------------------------


def test_groups_share_prompts_and_ids_are_consistent(kw):
    n, g, seed = 12, 4, 11
    vec = gym.make_vec(TEST_ID, num_envs=n, group_size=g, device="cpu", **kw)
    assert vec.group_size == g and vec.num_groups == 3
    _, info = vec.reset(seed=seed)
    assert list(info["group_id"]) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert list(info["episode_id"]) == list(range(n))
    for k in range(3):
        assert len(set(info["prompt"][k * g : (k + 1) * g])) == 1

    episode_prompt: dict[int, str] = {}  # episode id -> prompt text
    episode_group: dict[int, int] = {}
    current = info["episode_id"].copy()
    for j in range(n):
        episode_prompt[current[j]] = info["prompt"][j]
        episode_group[current[j]] = info["group_id"][j]
    finished_by_group: dict[int, list[tuple[int, str]]] = defaultdict(list)
    out_of_step = 0
    rng = np.random.default_rng(0)
    for step in range(250):
        _, _, term, trunc, info = vec.step(biased_actions(rng, n, vec.single_action_space.n, step))
        np.testing.assert_array_equal(info["episode_id"], current)  # ids of the episode the action belonged to
        np.testing.assert_array_equal(info["group_id"], current // g)
        done = np.flatnonzero(term | trunc)
        for j in done:
            fi = info["final_info"]
            assert fi["episode_id"][j] == current[j] and fi["group_id"][j] == current[j] // g
            assert fi["prompt"][j] == episode_prompt[current[j]]
            finished_by_group[int(fi["group_id"][j])].append((int(fi["episode_id"][j]), fi["prompt"][j]))
        nxt = vec.unwrapped.episode_ids()
        for j in done:  # the new episode: next id of this env, prompt of its group round
            assert nxt[j] == current[j] + n and j == nxt[j] % n
            episode_prompt[nxt[j]] = info["prompt"][j]
            episode_group[nxt[j]] = nxt[j] // g
        current = nxt
        rounds = current // n
        out_of_step += sum(len(set(rounds[k * g : (k + 1) * g])) > 1 for k in range(3))

    assert out_of_step > 50  # members ran out of step (early finishers did not wait)
    complete = 0
    for gid, eps in finished_by_group.items():
        assert len(eps) <= g and len({p for _, p in eps}) == 1  # one prompt per group round
        assert {e // g for e, _ in eps} == {gid} and len({e for e, _ in eps}) == len(eps)
        complete += len(eps) == g
    assert complete > 30
    # every episode of a group round started with the same prompt, including unfinished ones
    by_group = defaultdict(set)
    for e, p in episode_prompt.items():
        by_group[episode_group[e]].add(p)
    assert all(len(ps) == 1 for ps in by_group.values())

    # group k's r-th prompt is its RNG's r-th draw (RNG seeded by its first member's seed)
    for k in range(3):
        rng_k, _ = seeding.np_random(seed + k * g)
        rounds_seen = sorted({gid // 3 for gid in by_group if gid % 3 == k})
        draws = [PROMPTS[int(rng_k.integers(len(PROMPTS)))] for _ in range(max(rounds_seen) + 1)]
        for r in rounds_seen:
            assert by_group[r * 3 + k] == {draws[r]}


def test_group_members_far_out_of_step_keep_their_rounds_prompts(kw):
    """One member ends every episode on its first token while the others run the whole budget, so the
    group's rounds drift far apart (past the prompt ring's initial width, which must grow); every
    member's r-th episode still gets the group RNG's r-th draw, also after an unseeded reset."""
    n, g, seed = 6, 3, 4
    vec = TextGenVectorEnv(num_envs=n, group_size=g, device="cpu", **kw)
    _, info = vec.reset(seed=seed)
    prompts = defaultdict(list)  # env -> prompt of each of its episodes, in order
    for j in range(n):
        prompts[j].append(info["prompt"][j])
    actions = np.full(n, 4)
    actions[[0, 4]] = EOS
    for _ in range(3 * kw["max_new_tokens"]):
        _, _, term, trunc, info = vec.step(actions)
        for j in np.flatnonzero(term | trunc):
            prompts[j].append(info["prompt"][j])
    assert len(prompts[0]) == 3 * kw["max_new_tokens"] + 1 and len(prompts[1]) == 4  # 18 rounds apart
    _, info = vec.reset()  # every env moves to one round past the newest; the streams continue
    first = int(vec.unwrapped._round[0])
    for j in range(n):
        prompts[j].extend([None] * (first - len(prompts[j])) + [info["prompt"][j]])
    for k in range(n // g):
        rng_k, _ = seeding.np_random(seed + k * g)
        draws = [PROMPTS[int(rng_k.integers(len(PROMPTS)))] for _ in range(first + 1)]
        for j in range(k * g, (k + 1) * g):
            for r, p in enumerate(prompts[j]):
                if p is not None:
                    assert p == draws[r], (j, r)
        slow = prompts[k * g + 1]
        assert slow[-1] == draws[first]  # the round after the reset is the group's next draw


def test_group_size_one_matches_groups_of_singletons(kw):
    a = TextGenVectorEnv(num_envs=4, group_size=1, device="cpu", **kw)
    b = TextGenVectorEnv(num_envs=4, group_size=4, device="cpu", **kw)
    _, ia = a.reset(seed=5)
    _, ib = b.reset(seed=5)
    assert list(ia["group_id"]) == [0, 1, 2, 3] and list(ib["group_id"]) == [0, 0, 0, 0]
    assert len(set(ib["prompt"])) == 1 and ib["prompt"][0] == ia["prompt"][0]  # group 0 uses env 0's seed


def test_ids_never_repeat_across_resets(kw):
    vec = TextGenVectorEnv(num_envs=4, group_size=2, device="cpu", **kw)
    seen = set()
    _, info = vec.reset(seed=0)
    seen.update(info["episode_id"].tolist())
    vec.step(np.array([EOS, 4, 4, 4]))
    _, info = vec.reset(seed=0)
    assert not seen & set(info["episode_id"].tolist())
    assert (info["group_id"] == info["episode_id"] // 2).all()


# -- memory -----------------------------------------------------------------------------------------


def test_memory_1024_envs_256_token_windows(kw):
    vec = TextGenVectorEnv(
        num_envs=1024, group_size=8, device="cpu", **dict(kw, max_prompt_tokens=64, max_new_tokens=192)
    )
    assert vec.text_spec.window == 256
    assert vec.state_nbytes() == 1024 * (16 * 256 + 8)  # 4,104 bytes per env: ids + mask (int64) + counter
    obs, _ = vec.reset(seed=0)
    assert obs["input_ids"].shape == (1024, 256) and obs["input_ids"].nbytes == 1024 * 256 * 8
    rng = np.random.default_rng(0)
    for step in range(5):
        obs, *_ = vec.step(biased_actions(rng, 1024, vec.single_action_space.n, step))
    assert obs["attention_mask"].sum(1).min() >= 1


# -- bad input --------------------------------------------------------------------------------------


def test_bad_actions(kw):
    vec = TextGenVectorEnv(num_envs=3, device="cpu", **kw)
    with pytest.raises(RuntimeError, match="before reset"):
        vec.step(np.array([4, 4, 4]))
    vec.reset(seed=0)
    v = vec.single_action_space.n
    with pytest.raises(ValueError, match=r"shape \(2,\).*expected 3 integer token ids"):
        vec.step(np.array([4, 4]))
    with pytest.raises(ValueError, match=r"shape \(3, 1\)"):
        vec.step(np.array([[4], [4], [4]]))
    with pytest.raises(ValueError, match="not all integral"):
        vec.step(np.array([4.0, 4.5, 4.0]))
    with pytest.raises(ValueError, match="not all integral"):
        vec.step(np.array([4.0, np.nan, 4.0]))
    with pytest.raises(ValueError, match=f"action {v} of env 1 is outside the action space Discrete\\({v}\\)"):
        vec.step(np.array([4, v, 4]))
    with pytest.raises(ValueError, match="action -1 of env 2"):
        vec.step(torch.tensor([4, 4, -1]))
    with pytest.raises(ValueError, match="dtype"):
        vec.step(np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match="dtype"):
        vec.step(np.array([True, False, True]))
    obs, *_ = vec.step(np.array([4.0, 5.0, 6.0]))  # integral floats are fine
    assert obs["input_ids"][:, -1].tolist() == [4, 5, 6]
    obs, *_ = vec.step([7, 8, 9])
    assert obs["input_ids"][:, -1].tolist() == [7, 8, 9]


def test_bad_construction(kw):
    with pytest.raises(ValueError, match="num_envs=6 is not divisible by group_size=4"):
        TextGenVectorEnv(num_envs=6, group_size=4, device="cpu", **kw)
    with pytest.raises(TypeError, match="unknown keyword argument.*max_tokens"):
        TextGenVectorEnv(num_envs=2, device="cpu", max_tokens=3, **kw)
    with pytest.raises(ValueError, match="obs_backend"):
        TextGenVectorEnv(num_envs=2, device="cpu", obs_backend="jax", **kw)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        TextGenVectorEnv(num_envs=0, device="cpu", **kw)
    with pytest.raises(ValueError, match="device"):
        TextGenVectorEnv(num_envs=2, device="tpu-ish", **kw)
    vec = TextGenVectorEnv(num_envs=2, device="cpu", **kw)
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": np.array([True, False])})
    with pytest.raises(ValueError, match="a list of seeds must have num_envs=2"):
        vec.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match="unknown reset option"):
        vec.reset(options={"promt": "typo"})
    with pytest.raises(RuntimeError, match="before reset"):  # failed resets changed nothing
        vec.step(np.array([4, 4]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_says_what_to_do(kw):
    with pytest.raises(ValueError, match="CUDA is not available.*device='auto'.*device='cpu'"):
        TextGenVectorEnv(num_envs=2, device="cuda", **kw)
    assert resolve_device("auto").type == "cpu"


def test_fast_decoder_gives_exactly_what_tokenizer_decode_gives(tokenizer):
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.decoding import byte_level_table, fast_decoder

    bundled = AutoTokenizer.from_pretrained(tokenizer_path())  # byte-level BPE: the byte-table path
    assert byte_level_table(bundled, bundled._tokenizer) is not None
    assert byte_level_table(tokenizer, tokenizer._tokenizer) is None  # word-level: the Rust path
    rng = np.random.default_rng(0)
    for tok in (bundled, tokenizer):
        decode = fast_decoder(tok)
        assert decode is not None
        for _ in range(500):
            ids = rng.integers(0, len(tok), int(rng.integers(0, 40))).tolist()
            assert decode(ids) == tok.decode(ids, skip_special_tokens=True)
    # invalid UTF-8 (a lone continuation byte, a truncated multi-byte char) is replaced as the Rust decoder does
    lone = [i for i in range(len(bundled)) if bundled.convert_ids_to_tokens(i) in ("\u0100", "\u00c3")]
    for ids in ([lone[0]], lone, lone[::-1]):
        assert fast_decoder(bundled)(ids) == bundled.decode(ids, skip_special_tokens=True)


def test_batched_byte_table_decoding_equals_one_sequence_at_a_time():
    from transformers import AutoTokenizer

    from textrl_envs.assets import tokenizer_path
    from textrl_envs.decoding import ByteTableDecoder, fast_decoder

    bundled = AutoTokenizer.from_pretrained(tokenizer_path())
    decode = fast_decoder(bundled)
    assert isinstance(decode, ByteTableDecoder)
    rng = np.random.default_rng(1)
    lone = [i for i in range(len(bundled)) if bundled.convert_ids_to_tokens(i) in ("\u0100", "\u00c3")]
    rows = rng.integers(0, len(bundled), (64, 12))
    rows[::5, -2:] = lone[:2]  # invalid UTF-8 at the ends of some rows: replaced within each row only
    starts = rng.integers(0, 13, 64)
    stops = np.minimum(12, starts + rng.integers(0, 12, 64))
    got = decode.decode_rows(rows, starts, stops)
    assert got == [bundled.decode(r[a:b].tolist(), skip_special_tokens=True) for r, a, b in zip(rows, starts, stops)]
    assert decode.decode_rows(rows[:0], starts[:0], stops[:0]) == []
    ascii_ids = np.array([i for i, b in enumerate(decode.table) if b.isascii()])  # the one-decode path
    rows = ascii_ids[rng.integers(0, len(ascii_ids), (64, 12))]
    got = decode.decode_rows(rows, starts, stops)
    assert got == [bundled.decode(r[a:b].tolist(), skip_special_tokens=True) for r, a, b in zip(rows, starts, stops)]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("task_seeds", [False, True])
def test_upcoming_prompts_are_the_rounds_the_groups_draw_next(weighted, task_seeds):
    """A look ahead at the next rounds' prompts gives what the groups then draw, and changes none of it (uniform draws
    across a block boundary, weighted draws, interleaved task seeds)."""
    from textrl_envs.groups import DRAW_BLOCK, GroupPrompts, prompt_draw_cdf

    groups, size, num_prompts = 3, 2, 11
    peeked, plain = (GroupPrompts(groups, size, num_prompts, task_seeds=task_seeds) for _ in range(2))
    for prompts in (peeked, plain):
        prompts.seed([5, 6, 7])
        if weighted:
            prompts.set_cdf(prompt_draw_cdf(np.arange(1.0, num_prompts + 1), num_prompts))
        prompts.new_round(0)
    envs = np.arange(groups * size)
    rounds = np.zeros(groups * size, dtype=np.int64)
    seen = []
    for _ in range(DRAW_BLOCK + 6):
        ahead = peeked.upcoming(3)
        assert ahead.shape == (groups, 3)
        seen.append(ahead)
        rows = peeked.rows(envs, rounds)
        np.testing.assert_array_equal(rows, plain.rows(envs, rounds))
        np.testing.assert_array_equal(peeked.seeds(envs, rounds), plain.seeds(envs, rounds))
        for back, earlier in enumerate(reversed(seen[-3:])):  # what each of the last three looks said of round r
            np.testing.assert_array_equal(rows[::size], earlier[:, back])
        rounds += 1
    assert len({tuple(a.ravel()) for a in seen}) > 1  # the rounds moved on


def test_upcoming_prompt_windows_are_the_first_observations_of_the_next_episodes(kw):
    env = gym.make_vec(TEST_ID, num_envs=4, group_size=2, device="cpu", **kw)
    obs, _ = env.reset(seed=3)
    ids, mask = env.upcoming_prompt_windows()
    assert ids.shape == mask.shape and ids.shape[1] == obs["input_ids"].shape[1] and len(ids) <= 2
    want = {tuple(i[m.astype(bool)]) for i, m in zip(ids, mask)}
    started = set()
    for _ in range(40):  # every env ends its first episode: each group begins its second round
        obs, _, term, trunc, _ = env.step(np.full(4, EOS))
        for i, m in zip(np.asarray(obs["input_ids"]), np.asarray(obs["attention_mask"])):
            started.add(tuple(i[m.astype(bool)]))
        if (term | trunc).all():
            break
    assert started == want
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        env.upcoming_prompt_windows(0)
    env.close()
