"""Self-play on the two-player text games: does GRPO with a league beat the untrained LM and a held-out heuristic?

For each game and seed: the bundled LM trains with GRPO (by default group advantages, groups of 4 playing the same
side, deal and opponent) against a :class:`~sb3_grpo.callbacks.league.League` of its own frozen snapshots and a
random opponent, a snapshot every ``--snapshot-every`` updates, opponents drawn per episode (``--sampling``).
Before and after training it plays ``--eval-episodes`` games (half moving first, half second, sampled moves)
against held-out and seen opponents: ``random``, ``heuristic`` (never met in training) and ``untrained`` (a frozen
copy of the starting LM), and after training against an earlier snapshot of the same run (the one taken halfway).
``--advantage role`` trains with SPIRAL's role-conditioned advantage instead (no groups: every env plays its own
game). The page reports the exact score of the best response to each heuristic (the most any learner can get
against it, :mod:`textrl_envs.games.analysis`), the win rate and mean payoff, mean and 95% t-interval over seeds,
the share of illegal moves, the league's Elo curves (a figure beside the page) and (``--timing``) the LM
opponent's two engines timed. ``--jobs N`` runs N seeds at a time in their own processes (each run seeds itself)::

    python -m benchmarks.selfplay --games tictactoe,nim,kuhn --seeds 5 --timesteps 6144 --advantage role \\
        --eval-episodes 128 --timing --jobs 4 --out docs/results/selfplay.md

``--model smollm2-135m-instruct`` plays a real instruct model instead: the games in instruct mode (chat), LoRA
adapters, and LM opponents (the untrained model, the league's snapshots) that speak chat too, sharing the frozen
base. ``--results FILE`` keeps each finished run, so that a long study runs in parts; the page then also gives the
share of the exploitability gap against the heuristic that training closed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time

import numpy as np

from benchmarks import changed_settings
from sb3_grpo.compare.pages import write_results_page

GAME_IDS = {"tictactoe": "TicTacToe-v0", "nim": "Nim-v0", "kuhn": "KuhnPoker-v0"}
#: Student's t quantile t_{0.975, df} for the seed intervals.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
#: The published run's budget and learning rate, and how they were chosen (printed when a run uses them).
CHOSEN = ({"timesteps": 6144, "learning_rate": 3e-4},
          "The budget and the learning rate were chosen by a quick look at one Kuhn poker seed trained in 3072-step "
          "chunks with learning rates 1e-4 and 3e-4, judged on its payoff against the random player and its share "
          "of illegal moves (the heuristic played no part): both rates level off from about 6144 steps (payoff "
          "0.33-0.39 against the random player, 1-3% illegal moves, no better at 12288), and a 24576-step run at "
          "3e-4 fell back to 18% illegal moves; 6144 steps at 3e-4 is also what the shared 2-core machine allowed "
          "for 15 runs.")  # fmt: skip
#: Env ``i`` of a vector env seeded ``s`` gets ``s + i``: runs (and each evaluation's two sides) are seeded this
#: far apart so that no two share an env's stream of deals and opponent moves.
SEED_STRIDE, SIDE_SEED = 1000, 500
HP = {"n_epochs": 2, "learning_rate": 3e-4, "gamma": 1.0, "gae_lambda": 1.0, "ent_coef": 0.0}
FAST = {"grad_var_coef": 0.0, "adaptive_clip": None, "explore_alpha": 0.0, "kl_coef": 0.0}


#: A real model's update runs in micro-batches of this many whole games (the same gradient up to rounding): a
#: minibatch of tic-tac-toe's long chat conversations in one forward and backward needs more than 15 GB, in
#: micro-batches of 4 games under 5 GB.
REAL_MICRO_BATCH = 4
#: A real model trains LoRA adapters of this shape (the real-model study's).
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
#: Tokens a chat model may write for one move (a short sentence).
CHAT_MOVE_TOKENS = 6


def model_setup(model: str | None, dtype: str = "float32") -> tuple[dict, dict, dict]:
    """``(env kwargs, policy kwargs, LM-opponent kwargs)``: the bundled LM in text mode, or ``model`` (a path, a Hub
    id or a packaged name such as ``smollm2-135m-instruct``) in instruct mode with LoRA, its opponents speaking chat.
    ``dtype``: the LM's weights (``"bfloat16"``: the frozen base in bfloat16, its LoRA adapters and the value head in
    float32, as in QLoRA's recipe without the quantization; the league's snapshots share that base)."""
    policy = {} if dtype == "float32" else {"dtype": dtype}
    if model is None:
        return {}, policy, {}
    env = {"tokenizer": model, "instruct": True}
    opponent = {"tokenizer": model, "chat": True, "max_turn_tokens": CHAT_MOVE_TOKENS}
    return env, {"model": model, "lora": LORA, **policy}, opponent


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval over seeds (0 for a single seed)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), 0.0
    return float(x.mean()), T975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / math.sqrt(len(x))


def evaluate(
    model, game_id: str, game, opponent, episodes: int, seed: int, real: str | None = None
) -> dict[str, float]:
    """Win rate, mean payoff and share of games lost by an illegal move, over ``episodes`` sampled games, half
    of them moving first and half second (``payoff_first``, ``payoff_second``: each side's mean payoff); ``real``:
    the real model's name (instruct mode)."""
    from textrl_envs.games import SelfPlay
    from textrl_envs.sb3 import make_vec_env

    env_kwargs = model_setup(real)[0]
    out: dict[str, list[float]] = {"win": [], "payoff": [], "illegal": []}
    for side, name in ((0, "first"), (1, "second")):
        play = SelfPlay(game, opponent, learner_player=side, chat=real is not None)
        env = make_vec_env(
            game_id, n_envs=16, seed=seed + SIDE_SEED * side, device="cpu", interaction=play, **env_kwargs
        )
        obs = env.reset()
        returns, illegal = [], []
        while len(returns) < episodes // 2:
            actions, _ = model.predict(obs, deterministic=False)
            obs, _, dones, infos = env.step(actions)
            for i in np.flatnonzero(dones):
                returns.append(float(infos[i]["episode"]["r"]))
                illegal.append(infos[i]["forfeit"] == "learner")
        env.close()
        r = np.asarray(returns[: episodes // 2])
        out["win"] += list(r > 0)
        out["payoff"] += list(r)
        out["illegal"] += illegal[: episodes // 2]
        out[f"payoff_{name}"] = [float(r.mean())]
    return {k: float(np.mean(v)) for k, v in out.items()}


def untrained_replies(game_name: str, model: str, episodes: int = 16, seed: int = 0, shown: int = 3) -> dict:
    """What the untrained ``model`` writes when it is asked for a move: ``episodes`` games against the random player
    (half moving first, half second, one per env, replies sampled as in training), with the share of its turns whose
    reply states a legal move (every turn but the last of a game it forfeits) and ``shown`` replies that did not (the
    last turn of the first games it forfeited)."""
    import warnings

    from sb3_grpo import GRPO
    from textrl_envs.games import SelfPlay, make_game
    from textrl_envs.sb3 import make_vec_env

    game_id, game = GAME_IDS[game_name], make_game(game_name)
    env_kwargs = model_setup(model)[0]
    turns = forfeits = 0
    bad: list[str] = []
    for side in (0, 1):
        env = make_vec_env(game_id, n_envs=episodes // 2, seed=seed + SIDE_SEED * side, device="cpu",
                           interaction=SelfPlay(game, "random", learner_player=side, chat=True),
                           **env_kwargs)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the rollout buffer's size: this model only predicts
            lm = GRPO("CausalLMPolicy", env, n_steps=8, batch_size=8 * env.num_envs, seed=seed, device="cpu",
                      policy_kwargs={"model": model})  # fmt: skip
        obs, ended = env.reset(), np.zeros(env.num_envs, dtype=bool)
        while not ended.all():  # each env's first game only: the games that end first are not a fair sample
            actions, _ = lm.predict(obs, deterministic=False)
            obs, _, dones, infos = env.step(actions)
            for i in np.flatnonzero(dones & ~ended):
                ended[i] = True
                said = [t["text"] for t in infos[i]["transcript"] if t["role"] == "agent"]
                turns += len(said)
                if infos[i]["forfeit"] == "learner":
                    forfeits += 1
                    bad.append(said[-1] if said else "")
        env.close()
    return {
        "episodes": episodes,
        "turns": turns,
        "legal": (turns - forfeits) / max(turns, 1),
        "unreadable": bad[:shown],
    }


def replies_section(replies: dict[str, dict]) -> list[str]:
    """Why games are lost by illegal moves: the untrained model's replies (:func:`untrained_replies`)."""
    lines = ["", "## Why games are lost by illegal moves", "",
             "The untrained model asked for a move, in games against the random player (replies sampled as in "
             "training): the share of its turns whose reply stated a legal move, and replies that did not. A game "
             "ends at the first reply that states no legal move, so a tic-tac-toe game of 3-5 learner turns is lost "
             "that way far more often than a single turn is.", "",
             "| game | games | turns | replies stating a legal move | replies that did not (first 80 characters) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for game, r in replies.items():
        shown = " / ".join("`" + " ".join(text.split())[:80].replace("`", "'").replace("|", "/") + "`"
                           for text in r["unreadable"]) or "–"  # fmt: skip
        lines.append(f"| {game} | {r['episodes']} | {r['turns']} | {r['legal']:.0%} | {shown} |")
    return lines


def heuristic_bounds(game) -> dict[str, float]:
    """What the best response to the game's heuristic scores (exact, :func:`~textrl_envs.games.analysis.
    best_response`): its payoff moving first, second and on average over both, and its win rate over both."""
    from textrl_envs.games.analysis import best_response

    first, second = best_response(game, 0), best_response(game, 1)
    return {"first": first.value, "second": second.value, "payoff": (first.value + second.value) / 2,
            "win": (first.win + second.win) / 2}  # fmt: skip


def run_one(game_name: str, seed: int, args) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback

    from sb3_grpo import GRPO
    from sb3_grpo.callbacks.league import League, LeagueCallback
    from textrl_envs.games import PolicyOpponent, SelfPlay, make_game
    from textrl_envs.sb3 import make_vec_env

    game_id, game = GAME_IDS[game_name], make_game(game_name)
    env_kwargs, policy_kwargs, lm_opponent = model_setup(args.model, args.dtype)
    league = League(sampling=args.sampling, fixed={"random": "random"})
    group_size = args.group_size if args.advantage != "role" else 1
    env = make_vec_env(game_id, n_envs=args.n_envs, group_size=group_size, seed=SEED_STRIDE * seed, device="cpu",
                       interaction=SelfPlay(game, league, chat=args.model is not None), **env_kwargs)  # fmt: skip
    model = GRPO("CausalLMPolicy", env, n_steps=args.n_steps, batch_size=args.n_steps * args.n_envs // 2,
                 advantage=args.advantage, seed=seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs,
                 micro_batch_size=REAL_MICRO_BATCH if args.model else None,
                 **{**HP, "learning_rate": args.learning_rate}, **FAST)  # fmt: skip
    untrained = PolicyOpponent.snapshot(model.policy, name="untrained", **lm_opponent)
    opponents = {"random": "random", "heuristic": "heuristic", "untrained": untrained}
    eval_seed = 10_000 + SEED_STRIDE * seed

    def evaluate_all() -> dict[str, dict[str, float]]:
        return {k: evaluate(model, game_id, game, o, args.eval_episodes, eval_seed, args.model)
                for k, o in opponents.items()}  # fmt: skip

    before = evaluate_all()

    class Ratings(BaseCallback):
        def __init__(self):
            super().__init__()
            self.curve = []

        def _on_rollout_end(self):
            self.curve.append(league.learner_rating)

        def _on_step(self):
            return True

    ratings = Ratings()
    t0 = time.perf_counter()
    snapshots = LeagueCallback(league, snapshot_every=args.snapshot_every, opponent_kwargs=lm_opponent)
    model.learn(args.timesteps, callback=[snapshots, ratings])
    seconds = time.perf_counter() - t0
    after = evaluate_all()
    # an earlier snapshot of this run (the one taken halfway through training), met in training as a league member
    snaps = [m for m in league.members if m.snapshot]
    earlier = snaps[len(snaps) // 2]
    after["earlier"] = evaluate(model, game_id, game, earlier.opponent, args.eval_episodes, eval_seed, args.model)
    after["earlier"]["name"] = earlier.name
    return {"before": before, "after": after, "curve": ratings.curve, "seconds": seconds,
            "members": {m.name: round(m.rating) for m in league.members}}  # fmt: skip


def opponent_timing(game_name: str, batch: int = 16, batches: int = 4, repeats: int = 7) -> dict[str, float]:
    """The frozen LM opponent's two engines on the same turns: milliseconds per batched call of ``batch`` moves
    (the median over ``repeats`` passes of ``batches`` calls), and whether they wrote the same moves.

    The turns are the opponent's side of real games: the untrained LM (the learner) against an opponent that
    records what it reads and answers with the game's heuristic."""
    import torch as th

    from sb3_grpo import GRPO
    from textrl_envs.games import FunctionOpponent, OpponentTurn, PolicyOpponent, SelfPlay, make_game
    from textrl_envs.sb3 import make_vec_env

    game, seen = make_game(game_name), []

    def recording(turn):
        seen.append((turn.state, turn.player, turn.text))
        return game.move_text(game.heuristic(turn.state, turn.rng))

    env = make_vec_env(GAME_IDS[game_name], n_envs=batch, seed=0, device="cpu",
                       interaction=SelfPlay(game, FunctionOpponent(recording)))  # fmt: skip
    model = GRPO("CausalLMPolicy", env, n_steps=16, batch_size=16 * batch, seed=0, device="cpu")
    obs = env.reset()
    while len(seen) < batch * batches:
        obs, *_ = env.step(model.predict(obs)[0])
    seen = seen[: batch * batches]
    frozen = PolicyOpponent.snapshot(model.policy)
    out: dict[str, float] = {}
    moves = {}
    for engine in ("recompute", "cache"):
        opponent = PolicyOpponent(frozen.policy, engine=engine)
        times, written = [], []
        for rep in range(repeats + 1):  # the first pass warms up
            turns = [OpponentTurn(game, s, p, t, np.random.default_rng(i)) for i, (s, p, t) in enumerate(seen)]
            t0 = time.perf_counter()
            with th.no_grad():
                written = [m for k in range(0, len(turns), batch) for m in opponent.moves(turns[k : k + batch])]
            if rep:
                times.append((time.perf_counter() - t0) / batches * 1000)
        out[engine], moves[engine] = float(np.median(times)), written
    tok = frozen.tokenizer
    out["tokens"] = float(np.mean([len(tok(t, add_special_tokens=False)["input_ids"]) for _, _, t in seen]))
    out["same"] = float(moves["cache"] == moves["recompute"])
    return out


def timing_section(timings: dict[str, dict[str, float]]) -> list[str]:
    lines = ["", "## The LM opponent's moves: recomputed windows or the KV cache", "",
             "A frozen snapshot answers every game whose opponent is to move in one batched call (16 moves per call "
             "here, at most 2 tokens each). `recompute` runs one forward of every whole window per token; `cache` "
             "prefills the windows once and decodes the next token on the LM's KV cache (the built-in decoder). "
             "Milliseconds per call, the median of 7 passes over the same 64 turns taken from real games (the "
             "opponent's side of the conversation, `tokens` long on average), one thread.", "",
             "| game | tokens read | recompute (ms) | cache (ms) | speed-up | same moves |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for game, t in timings.items():
        lines.append(f"| {game} | {t['tokens']:.0f} | {t['recompute']:.1f} | {t['cache']:.1f} | "
                     f"{t['recompute'] / t['cache']:.2f}x | {'yes' if t['same'] else 'no'} |")  # fmt: skip
    return lines


def beats(values: list[float]) -> str:
    """``yes`` when the 95% interval over seeds of a mean payoff lies above 0, ``no`` when it lies below or
    holds 0 (``level``)."""
    m, h = interval(values)
    return "yes" if m - h > 0 else "no" if m + h < 0 else "level"


def rating_figure(results: dict[str, list[dict]], path: str) -> str:
    """The learner's Elo rating after each rollout, one line per seed and a panel per game; the figure's file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sb3_grpo.file_io import save_figure_atomic

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.2), squeeze=False)
    for ax, (game, runs) in zip(axes[0], results.items()):
        for seed, r in enumerate(runs):
            ax.plot(range(1, len(r["curve"]) + 1), r["curve"], label=f"seed {seed}", lw=1.2)
        ax.axhline(1000, color="grey", lw=0.8, ls=":")
        ax.set_title(game)
        ax.set_xlabel("rollout")
        ax.set_ylabel("learner's Elo")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)
    return path


def bounds_section(results: dict[str, list[dict]]) -> tuple[list[str], dict[str, dict[str, float]]]:
    """The rows of the best responses' table and the notes under it, and the bounds by game."""
    from textrl_envs.games import make_game
    from textrl_envs.games.analysis import policy_value

    lines: list[str] = []
    bounds = {}
    for game in results:
        b = bounds[game] = heuristic_bounds(make_game(game))
        lines.append(f"| {game} | {b['first']:.3f} | {b['second']:.3f} | {b['payoff']:.3f} | {b['win']:.3f} |")
    if "kuhn" in results:
        kuhn = make_game("kuhn")
        eq = kuhn.equilibrium_policy(0.0)
        both = round(sum(policy_value(kuhn, eq, kuhn.heuristic_policy, side)[0] for side in (0, 1)) / 2, 9) + 0.0
        lines += ["", f"In Kuhn poker the heuristic is close to an equilibrium: an equilibrium strategy (Kuhn 1950, "
                  f"alpha = 0) scores {both:.3f} against it over both seats, so only a learner that exploits its "
                  f"slips gets ahead (moving second it never bluffs the Jack; moving first it bets the King every "
                  f"time but calls a bet with the Queen only a third of the time), and by "
                  f"{bounds['kuhn']['payoff']:.3f} chips a hand at most."]  # fmt: skip
    if "nim" in results:
        lines += ["", "Nim's heuristic is perfect play (leave a multiple of 4 when it can): the best response wins "
                  "exactly the heaps that the side to move can win, so no learner gets ahead of it with sides "
                  "alternating; matching its payoff of 0 is the most there is."]  # fmt: skip
    return lines, bounds


def gap_fraction(run: dict, bound: float) -> float | None:
    """The share of the exploitability gap against the heuristic that training closed: (payoff after - payoff
    before) / (best response's payoff - payoff before); ``None`` where there was no gap (the learner already scored
    the best response's payoff)."""
    before, after = run["before"]["heuristic"]["payoff"], run["after"]["heuristic"]["payoff"]
    gap = bound - before
    return None if gap <= 1e-9 else (after - before) / gap


def gap_section(results: dict[str, list[dict]], bounds: dict[str, dict[str, float]]) -> list[str]:
    """The table of the gap closed against the heuristic, per game."""
    lines = ["", "## The exploitability gap closed against the heuristic", "",
             "Per seed, (payoff after - payoff before) / (best response's payoff - payoff before) against the "
             "heuristic, both sides: 0 is no progress, 1 is the best response's score, below 0 is worse than "
             "before. Mean and 95% t-interval over seeds.", "",
             "| game | best response | payoff before | payoff after | gap closed |",
             "|---|---|---|---|---|"]  # fmt: skip
    for game, runs in results.items():
        bound = bounds[game]["payoff"]
        fractions = [f for f in (gap_fraction(r, bound) for r in runs) if f is not None]
        cells = [interval([r[when]["heuristic"]["payoff"] for r in runs]) for when in ("before", "after")]
        closed = "no gap" if not fractions else "{:.2f} ± {:.2f}".format(*interval(fractions))
        lines.append(f"| {game} | {bound:.3f} | {cells[0][0]:.2f} ± {cells[0][1]:.2f} | "
                     f"{cells[1][0]:.2f} ± {cells[1][1]:.2f} | {closed} |")  # fmt: skip
    return lines


#: The study's goals on a real model: tic-tac-toe's share of games lost by an illegal move, and the share of the
#: exploitability gap against the heuristic closed on one game at least.
ILLEGAL_GOAL, GAP_GOAL = 0.05, 0.5
HELD_OUT = ("random", "heuristic", "untrained")


def goals_section(results: dict[str, list[dict]], bounds: dict[str, dict[str, float]]) -> list[str]:
    """The goals of the study on a real model, each measured (mean and 95% t-interval over seeds) and met or not:
    the learner beats the untrained model and random play on every game (payoff interval above 0); tic-tac-toe's
    share of games lost by an illegal move, over the held-out opponents, under :data:`ILLEGAL_GOAL`; at least
    :data:`GAP_GOAL` of the exploitability gap closed on one game. An unmet goal gets the figures that say how far
    off it is."""
    lines = ["", "## The goals", "", "| goal | measured | met |", "|---|---|---|"]
    unmet = []
    for game, runs in results.items():
        for opp in ("untrained", "random"):
            payoffs = [r["after"][opp]["payoff"] for r in runs]
            m, h = interval(payoffs)
            met = beats(payoffs) == "yes"
            lines.append(f"| beat {opp} play at {game} (payoff interval above 0) | {m:.2f} ± {h:.2f} | "
                         f"{'yes' if met else 'no'} |")  # fmt: skip
    if "tictactoe" in results:
        runs = results["tictactoe"]
        per_seed = {when: [float(np.mean([r[when][o]["illegal"] for o in HELD_OUT])) for r in runs]
                    for when in ("before", "after")}  # fmt: skip
        (m, h), (b, _) = interval(per_seed["after"]), interval(per_seed["before"])
        met = m + h < ILLEGAL_GOAL
        lines.append(f"| tic-tac-toe games lost by an illegal move under {ILLEGAL_GOAL:.0%} | {m:.2f} ± {h:.2f} "
                     f"(before training {b:.2f}) | {'yes' if met else 'no'} |")  # fmt: skip
        if not met:
            unmet.append(f"tic-tac-toe's illegal moves: {b:.0%} of the games before training, {m:.0%} after "
                         f"(interval up to {m + h:.0%}; the goal: under {ILLEGAL_GOAL:.0%})")  # fmt: skip
    best = None
    for game, runs in results.items():
        fractions = [f for f in (gap_fraction(r, bounds[game]["payoff"]) for r in runs) if f is not None]
        if fractions and (best is None or interval(fractions)[0] > best[1]):
            best = (game, *interval(fractions))
    if best is not None:
        game, m, h = best
        met = m - h >= GAP_GOAL
        lines.append(f"| at least {GAP_GOAL:.0%} of the exploitability gap closed on one game (the best: {game}) | "
                     f"{m:.2f} ± {h:.2f} | {'yes' if met else 'no'} |")  # fmt: skip
        if not met:
            unmet.append(f"the gap closed: {m:.0%} on {game}, the better game (interval down to {m - h:.0%}), "
                         f"against the {GAP_GOAL:.0%} asked")  # fmt: skip
    lines.append("")
    lines.append("Met means the whole interval is on the goal's side. " + (
        "How far off: " + "; ".join(unmet) + "." if unmet else "Every goal is met."))  # fmt: skip
    return lines


def earlier_section(results: dict[str, list[dict]]) -> list[str]:
    """The learner after training against an earlier snapshot of its own run."""
    lines = ["", "Against an earlier snapshot of the same run (the one taken halfway through training, a league "
             "member it met in training), after training:", "",
             "| game | snapshot | win rate | payoff | illegal |", "|---|---|---|---|---|"]  # fmt: skip
    for game, runs in results.items():
        cells = [interval([r["after"]["earlier"][key] for r in runs]) for key in ("win", "payoff", "illegal")]
        names = sorted({r["after"]["earlier"]["name"] for r in runs})
        lines.append(f"| {game} | {', '.join(names)} | " + " | ".join(f"{m:.2f} ± {h:.2f}" for m, h in cells) + " |")
    return lines


def page(results: dict[str, list[dict]], args, timings: dict[str, dict[str, float]] | None = None,
         figure: str | None = None, replies: dict[str, dict] | None = None) -> str:  # fmt: skip
    """The results page's body (the stamp and title are :func:`~sb3_grpo.compare.pages.write_results_page`'s)."""
    how = ("role-conditioned advantages (SPIRAL's running baseline per game and role, no groups)"
           if args.advantage == "role" else f"{args.advantage} advantages, groups of {args.group_size}")  # fmt: skip
    policy = ("the bundled LM" if args.model is None else
              f"`{args.model}` in instruct mode (the rules, boards and moves in plain language through its chat "
              f"template, each reply started with the game's prefix, such as \"I take cell\", and its move read "
              f"from the first {CHAT_MOVE_TOKENS} tokens after it; its LM opponents speak chat too) with LoRA "
              f"r={LORA['r']}, updated in micro-batches of {REAL_MICRO_BATCH} games")  # fmt: skip
    if args.dtype != "float32":
        policy += f", its frozen weights in {args.dtype} (the adapters and the value head in float32)"
    lines = [
        f"GRPO ({how}, learning rate {args.learning_rate:g}) on {policy}, {args.timesteps} steps (tokens) "
        f"per run, {args.n_envs} envs, against a league of its own frozen snapshots (one every "
        f"{args.snapshot_every} updates) and a random opponent, one drawn per episode (`{args.sampling}`). "
        f"Evaluated before and after training on {args.eval_episodes} games per opponent (half moving first, "
        f"half second, moves sampled; every seed trains and is evaluated on streams of games of its own), over "
        f"{args.seeds} seeds: mean and 95% t-interval over seeds. `heuristic` is "
        "never met in training; `untrained` is a frozen copy of the starting LM (the league's first snapshot). "
        "A win is a positive payoff (Kuhn poker: chips won); `illegal` is the share of games the learner lost by "
        "an unreadable or illegal move. `beats` says whether the interval of the payoff after training lies "
        "above 0 (`yes`), below it (`no`) or holds it (`level`).",
        "",
        *([CHOSEN[1], ""] if all(getattr(args, k) == v for k, v in CHOSEN[0].items()) else []),
        "## What the best player could score against the heuristic",
        "",
        "Exact, by walking each game's tree (`textrl_envs.games.analysis.best_response`): the best response to the "
        "heuristic, deciding on what it sees (its own card in Kuhn poker), over the start positions the game deals. "
        "No learner scores more than this against the heuristic; the learner's payoff against it below is to be "
        "read against it.",
        "",
        "| game | payoff moving first | payoff moving second | payoff, both sides | win rate, both sides |",
        "|---|---|---|---|---|",
    ]
    section, bounds = bounds_section(results)
    lines += section
    lines += [
        "",
        "## Win rates against held-out opponents",
        "",
        "| game | opponent | win rate before | win rate after | payoff before | payoff after | beats | illegal "
        "before | illegal after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for game, runs in results.items():
        for opp in ("random", "heuristic", "untrained"):
            c = {}
            for key in ("win", "payoff", "illegal"):
                for when in ("before", "after"):
                    m, h = interval([r[when][opp][key] for r in runs])
                    c[key, when] = f"{m:.2f} ± {h:.2f}"
            verdict = beats([r["after"][opp]["payoff"] for r in runs])
            lines.append(
                f"| {game} | {opp} | {c['win', 'before']} | {c['win', 'after']} | {c['payoff', 'before']} | "
                f"{c['payoff', 'after']} | {verdict} | {c['illegal', 'before']} | {c['illegal', 'after']} |"
            )
    lines += ["", "Against the heuristic after training, by side (payoff; the best response's in brackets):", "",
              "| game | moving first | moving second |", "|---|---|---|"]  # fmt: skip
    for game, runs in results.items():
        cells = []
        for side in ("first", "second"):
            m, h = interval([r["after"]["heuristic"][f"payoff_{side}"] for r in runs])
            cells.append(f"{m:.2f} ± {h:.2f} ({bounds[game][side]:.2f})")
        lines.append(f"| {game} | {cells[0]} | {cells[1]} |")
    lines += earlier_section(results)
    lines += gap_section(results, bounds)
    if args.model is not None:
        lines += goals_section(results, bounds)
    if replies:
        lines += replies_section(replies)
    summary = []
    for game, runs in results.items():
        ok = [beats([r["after"][o]["payoff"] for r in runs]) for o in ("untrained", "heuristic")]
        summary.append(f"{game}: the untrained policy {ok[0]}, the heuristic {ok[1]}")
    lines += ["", "Beaten on payoff after training (interval above 0): " + "; ".join(summary) + "."]
    lines += ["", "## The league's ratings", "",
              "The learner's Elo rating after each rollout (start 1000, K = 32; a win against any member counts, "
              "the random player included), and every member's final rating.", ""]  # fmt: skip
    if figure:
        lines += [f"![The learner's Elo rating after each rollout]({os.path.basename(figure)})", ""]
    for game, runs in results.items():
        for seed, r in enumerate(runs):
            curve = ", ".join(f"{x:.0f}" for x in r["curve"])
            members = ", ".join(f"{k} {v}" for k, v in r["members"].items())
            lines.append(f"- {game}, seed {seed} ({r['seconds']:.0f} s of training): {curve}; members: {members}")
    if timings:
        lines += timing_section(timings)
    lines.append("")
    return "\n".join(lines)


#: The settings every run kept in one ``--results`` file shares.
SETTINGS = ("timesteps", "n_envs", "group_size", "n_steps", "snapshot_every", "eval_episodes", "advantage",
            "learning_rate", "sampling", "model", "dtype")  # fmt: skip


#: The settings added after the first kept runs, with the value those runs had.
SETTING_DEFAULTS = {"dtype": "float32"}


def load_runs(path: str | None, args) -> dict[str, dict]:
    """The runs kept in ``path`` (``game/seed`` -> result), refusing a file made with other settings."""
    import json

    if not path or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        kept = json.load(f)
    asked = {k: getattr(args, k) for k in SETTINGS}
    # a file written before a setting existed was made with that setting's default
    differ = changed_settings({**SETTING_DEFAULTS, **kept["settings"]}, asked)
    if differ:
        raise SystemExit(f"the runs in {path} were made with {', '.join(differ)}; rerun with those settings, or "
                         "pass another --results file")  # fmt: skip
    return kept["runs"]


def save_runs(path: str, args, runs: dict[str, dict]) -> None:
    from sb3_grpo.file_io import write_json_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, {"settings": {k: getattr(args, k) for k in SETTINGS}, "runs": runs})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="textrl-bench selfplay", description=__doc__.split("\n")[0])
    p.add_argument("--games", default="tictactoe,nim,kuhn", help="comma-separated: tictactoe, nim, kuhn")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--timesteps", type=int, default=3072)
    p.add_argument("--n-envs", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--n-steps", type=int, default=32)
    p.add_argument("--snapshot-every", type=int, default=1)
    p.add_argument("--eval-episodes", type=int, default=96)
    p.add_argument("--advantage", default="group", choices=["group", "group_mean", "rloo", "role"])
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--sampling", default="uniform", choices=["latest", "uniform", "rating"],
                   help="how the league draws an opponent per episode")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process")
    p.add_argument("--timing", action="store_true", help="also time the LM opponent's two engines")
    p.add_argument("--out", default="docs/results/selfplay.md")
    p.add_argument("--model", default=None,
                   help="a real instruct model (e.g. smollm2-135m-instruct): instruct mode, LoRA, chat opponents "
                        "(default: the bundled LM in text mode)")  # fmt: skip
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the LM's weights: bfloat16 halves the frozen base's memory and keeps the LoRA adapters and "
                        "the value head in float32")  # fmt: skip
    p.add_argument("--results", default=None,
                   help="keep each finished run here (JSON) and skip it when the command runs again")  # fmt: skip
    args = p.parse_args(argv)
    games = [g.strip() for g in args.games.split(",") if g.strip()]
    unknown = [g for g in games if g not in GAME_IDS]
    if unknown:
        p.error(f"unknown game(s) {unknown}; known: {', '.join(GAME_IDS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    jobs = [(game, seed) for game in games for seed in range(args.seeds)]
    stored = load_runs(args.results, args)
    done: dict[tuple[str, int], dict] = {
        key: stored[f"{key[0]}/{key[1]}"] for key in jobs if f"{key[0]}/{key[1]}" in stored
    }
    jobs = [key for key in jobs if key not in done]

    def report(key, r):
        done[key] = r
        if args.results:
            stored[f"{key[0]}/{key[1]}"] = r
            save_runs(args.results, args, stored)
        after = {k: round(v["payoff"], 2) for k, v in r["after"].items()}
        print(*key, "payoff after", after, f"{r['seconds']:.0f}s", flush=True)

    if args.jobs > 1:  # separate processes: each run is seeded on its own, so the figures do not depend on it
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {key: pool.submit(run_one, *key, args) for key in jobs}
            for key, f in futures.items():
                report(key, f.result())
    else:
        for key in jobs:
            report(key, run_one(*key, args))
    results = {game: [done[game, seed] for seed in range(args.seeds)] for game in games}
    timings = {game: opponent_timing(game) for game in games if game != "tictactoe"} if args.timing else None
    figure = rating_figure(results, os.path.splitext(args.out)[0] + "-ratings.png")
    command = shlex.join(["textrl-bench", "selfplay", *argv])
    replies = {game: untrained_replies(game, args.model) for game in games} if args.model else None
    body = page(results, args, timings, figure, replies)
    title = "Self-play on the two-player text games"
    title += f": {args.model}" if args.model else ": the bundled 1M-parameter LM (small-model results)"
    out = write_results_page(args.out, title, body, command)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
