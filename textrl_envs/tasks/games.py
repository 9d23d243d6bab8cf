"""``TicTacToe-v0``, ``Nim-v0``, ``KuhnPoker-v0``: two-player games, the learner against an opponent.

Each id is the interactive text env over :class:`~textrl_envs.games.SelfPlay`; its class documents it. Pass
``interaction=SelfPlay(game, opponent=...)`` to play another opponent (a heuristic, a frozen LM policy, a
league; see :mod:`textrl_envs.games.opponents`) or a fixed side.
"""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import KUHN_POKER, NIM, TICTACTOE

__all__ = ["KuhnPokerEnv", "NimEnv", "TicTacToeEnv"]

_SHARED = """
    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the learner's next token. The learner acts only its own tokens; the
    opponent's move and the board after it are written into the observation in the step that ends the learner's
    turn.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``{W}``): the game's intro (the prompt), then the
    conversation from the learner's side (the boards it is shown and its moves), right-aligned, pad on the left
    with mask 0.

    ## Starting State
    The intro, then the board the learner moves on (after the opponent's first move when the learner plays
    second). The episode's generator, seeded by one draw of the env's ``np_random`` per episode, draws the
    learner's side (first or second, each half the time), the opponent (a league's pick) and the game's chance,
    then the random opponent's moves: ``reset(seed=s)`` replays an episode against the same opponent, and the
    members of a group (``group_size=G``) play the same side, deal and opponent, so group baselines compare
    like with like.

    ## Episode End
    A move ends at EOS or after ``max_turn_tokens = 2`` tokens (the bundled LM writes a move as one token and
    EOS). Terminated when the game is over (the last reply is the result, `` win`` / `` loss`` / `` draw``);
    an unreadable or illegal move loses at once. Truncated only if ``max_turns = {turns}`` or ``max_new_tokens``
    run out first, which a legal game never does. The final ``info`` holds ``turns`` and ``transcript``.

    ## Arguments
    ``gym.make("{id}", interaction=None, max_turns={turns}, max_turn_tokens=2, turn_end=None,
    max_new_tokens={new}, max_prompt_tokens={prompt}, tokenizer=None, reward_timeout=600.0, render_mode=None)``.
    ``interaction=SelfPlay({game}, opponent="heuristic", learner_player=None)`` sets the opponent (``"random"``,
    ``"heuristic"``, :class:`~textrl_envs.games.policy.PolicyOpponent`, a league, or a callable
    ``f(turn) -> str``) and the learner's side (``0`` first, ``1`` second, ``None`` alternating).

    ## Vectorized environment
    ``gym.make_vec("{id}", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`, which answers every move that ended in a step with one call
    (one batched call per opponent, one forward pass per token for an LM opponent) and equals ``SyncVectorEnv``
    over ``gym.make`` envs with the same seeds, opponents and actions.

    ## Version History
    * v0: Initial version.
"""


def _doc(head: str, task, game: str) -> str:
    shared = _SHARED.format(
        W=f"{task.max_prompt_tokens} + {task.max_new_tokens} = {task.max_prompt_tokens + task.max_new_tokens}",
        turns=task.max_turns,
        id=task.env_id,
        new=task.max_new_tokens,
        prompt=task.max_prompt_tokens,
        game=game,
    )
    return head + shared


class TicTacToeEnv(TextGenEnv):
    default_task = TICTACTOE.env_id


TicTacToeEnv.__doc__ = _doc(
    """Tic-tac-toe against an opponent: the board in nine characters, a move is a cell's digit.

    ## Description
    :class:`~textrl_envs.games.TicTacToe` through :class:`~textrl_envs.games.SelfPlay`. The prompt is
    ``"Tic-tac-toe, you are x."``; the board is written from the learner's side, ``x`` its marks, ``o`` the
    opponent's, ``.`` empty, row by row, and ends with `` x=`` where the move goes (`` x.o.x.... x=``, 13 tokens of
    the bundled tokenizer). The learner writes a cell 1-9 (the first digit of its turn) and EOS; the env plays
    it, the opponent answers (a random legal cell by default), and the next board follows.

    ## Rewards
    On the step that ends the game: 1 for a win, -1 for a loss (an illegal or unreadable move included), 0 for
    a draw. 0 on every other step.
""",
    TICTACTOE,
    "TicTacToe()",
)


class NimEnv(TextGenEnv):
    default_task = NIM.env_id


NimEnv.__doc__ = _doc(
    """One-heap Nim against an opponent: take 1 to 3 stones, whoever takes the last one wins.

    ## Description
    :class:`~textrl_envs.games.Nim` through :class:`~textrl_envs.games.SelfPlay`. The prompt is
    ``"Nim, take 1-3."``; the heap starts at 5-12 stones and the board is the heap, `` 9 left, x=``. The learner
    writes how many it takes (the first number of its turn) and EOS; the opponent takes its share (random by
    default; the heuristic opponent leaves a multiple of 4, which wins from any heap that is not one).

    ## Rewards
    On the step that ends the game: 1 for taking the last stone, -1 otherwise (an illegal move included). 0 on
    every other step.
""",
    NIM,
    "Nim()",
)


class KuhnPokerEnv(TextGenEnv):
    default_task = KUHN_POKER.env_id


KuhnPokerEnv.__doc__ = _doc(
    """Kuhn poker against an opponent: one card each of J, Q, K, one round of pass or bet.

    ## Description
    :class:`~textrl_envs.games.KuhnPoker` through :class:`~textrl_envs.games.SelfPlay`. The prompt is
    ``"Kuhn, 0 pass 1 bet."``; the board is the learner's card and the betting so far, `` K pb, x=`` (``-``
    before the first move). The learner writes ``0`` or ``p`` (check, or fold to a bet) or ``1`` or ``b`` (bet,
    or call), and EOS; the result shows the opponent's card (`` win, J``). The deal is chance, so even the best
    play loses some hands: compare policies over many seeds.

    ## Rewards
    On the step that ends the hand: the chips won or lost, -2 to 2 (each player antes 1; a bet and a call add
    1 each); an illegal move loses 1. 0 on every other step.
""",
    KUHN_POKER,
    "KuhnPoker()",
)
