"""Which prompt each group round uses: the prompt bookkeeping of :class:`~textrl_envs.vector.TextGenVectorEnv`.

Envs are split into groups of ``G`` consecutive envs; env ``j`` of group ``k = j // G`` counts its episodes
in rounds, and its ``r``-th episode uses its group's ``r``-th prompt. The first member to begin a round
draws that round's prompt from the group's RNG exactly as the single env draws one per episode
(``int(rng.integers(num_prompts))``); later members of the round read it back.

:class:`GroupPrompts` does this for a whole batch of starting envs with a few numpy operations and no
per-env Python loop:

* draws are taken :data:`DRAW_BLOCK` at a time per group (numpy gives the same values as drawing them one
  by one, which a test pins down) and handed out from a ``(groups, DRAW_BLOCK)`` buffer;
* the prompts of the rounds still ahead of some member live in a ring ``(groups, R)``, round ``r`` at
  column ``r % R``; ``R`` doubles whenever the members of a group drift further apart than that.

Interactive tasks also give every group round a *task seed* (``task_seeds=True``): the single env draws it from
its ``np_random`` right after the prompt (``rng.integers(TASK_SEED_BOUND)``, also when the prompt was given to
``reset``), so the draws interleave and are taken one at a time; the seeds live in a second ring beside the
prompts', and every member of a group round gets the same one (the same initial task state).

Prompt-draw weights (:func:`prompt_draw_cdf`, set by a curriculum through ``set_prompt_weights``) change only which
prompt a group round draws: :func:`draw_weighted` takes one uniform ``rng.random()`` per round and maps it through the
weights' cumulative sums (as ``rng.choice(n, p=weights / weights.sum())`` does), one round at a time, the same in the
single env and the vector env. Every member of the round still reads back the round's prompt. Without weights the
draws are ``rng.integers(num_prompts)`` as above.
"""

from __future__ import annotations

import copy

import numpy as np
from gymnasium.utils import seeding

from textrl_envs.interaction import TASK_SEED_BOUND

#: Prompt draws taken from a group's RNG at once (the same values as drawing them one by one).
DRAW_BLOCK = 64
#: Initial number of rounds the ring keeps per group (it grows when members drift further apart).
RING_ROUNDS = 4


def prompt_draw_cdf(weights, num_prompts: int) -> np.ndarray | None:
    """The normalised cumulative sums of prompt-draw weights (``None`` for ``None``: uniform draws).

    :param weights: ``num_prompts`` finite weights ``>= 0``, at least one ``> 0`` (a prompt of weight 0 is never
        drawn), or ``None``.
    :raises ValueError: for the wrong length, a negative or non-finite weight, or all weights zero.
    """
    if weights is None:
        return None
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"prompt weights must be numbers, one per prompt; got {weights!r}") from None
    if w.shape != (num_prompts,):
        raise ValueError(f"prompt weights must have one entry per prompt ({num_prompts}); got shape {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("prompt weights must be finite and >= 0 (0 never draws the prompt)")
    total = float(w.sum())
    if total <= 0.0:
        raise ValueError("prompt weights are all 0; give at least one prompt a weight > 0 (or None for uniform draws)")
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


def draw_weighted(rng: np.random.Generator, cdf: np.ndarray) -> int:
    """One prompt index drawn with the probabilities whose normalised cumulative sums are ``cdf``: the first index
    whose cumulative sum exceeds one ``rng.random()``."""
    return min(int(np.searchsorted(cdf, rng.random(), side="right")), len(cdf) - 1)


class GroupPrompts:
    """Per-group prompt RNGs, the draws taken ahead, and the prompt row of each recent group round.

    :param num_groups: Number of groups.
    :param group_size: Envs per group ``G``.
    :param num_prompts: Size of the prompt list the RNGs draw from.
    :param task_seeds: Also draw a task seed per group round, right after its prompt (interactive tasks).
    """

    def __init__(self, num_groups: int, group_size: int, num_prompts: int, task_seeds: bool = False) -> None:
        self.num_groups, self.group_size, self.num_prompts = num_groups, group_size, num_prompts
        self.task_seeds = task_seeds
        self._seed_ring = np.zeros((num_groups, RING_ROUNDS), dtype=np.int64)
        self.rngs: list[np.random.Generator | None] = [None] * num_groups
        self._draws = np.zeros((num_groups, DRAW_BLOCK), dtype=np.int64)
        self._next_draw = np.full(num_groups, DRAW_BLOCK, dtype=np.int64)  # DRAW_BLOCK: none left
        self._ring = np.zeros((num_groups, RING_ROUNDS), dtype=np.int64)
        self._newest = np.full(num_groups, -1, dtype=np.int64)  # newest round begun in each group
        self.cdf: np.ndarray | None = None  # prompt-draw weights' cumulative sums (None: uniform)

    def set_cdf(self, cdf: np.ndarray | None) -> None:
        """Draw the prompts of later rounds with these cumulative weights (:func:`prompt_draw_cdf`; ``None``:
        uniform). Rounds already begun keep their prompt; uniform draws taken ahead are discarded."""
        if cdf is not None:
            self._next_draw[:] = DRAW_BLOCK
        self.cdf = cdf

    def seed(self, seeds: list[int | None]) -> None:
        """Seed group ``k`` with ``seeds[k]``; ``None`` keeps its stream (a random one if it has none yet).

        A new stream discards the draws taken ahead from the old one.
        """
        for k, s in enumerate(seeds):
            if s is not None or self.rngs[k] is None:
                self.rngs[k], _ = seeding.np_random(s)
                self._next_draw[k] = DRAW_BLOCK

    def new_round(self, first_round: int, row: int | None = None) -> None:
        """Every group begins round ``first_round`` next (after a reset), with prompt ``row`` if given.

        :param first_round: The round all envs start now; rounds before it are forgotten.
        :param row: A prompt row for that round in every group (``reset(options=...)``), which draws nothing;
            ``None``: each group draws it.
        """
        if row is None:
            self._newest[:] = first_round - 1
        else:
            self._newest[:] = first_round
            col = first_round % self._ring.shape[1]
            self._ring[:, col] = row
            if self.task_seeds:  # the single env draws the task seed also when the prompt is given
                self._seed_ring[:, col] = [int(self._rng(k).integers(TASK_SEED_BOUND)) for k in range(self.num_groups)]

    def rows(self, envs: np.ndarray, all_rounds: np.ndarray) -> np.ndarray:
        """The prompt rows of the episodes ``envs`` begin now, drawing those of rounds begun first here.

        :param envs: ``(M,)`` distinct env indices.
        :param all_rounds: ``(N,)`` the current round of every env; ``all_rounds[envs]`` are the rounds begun now,
            each at most one past its group's newest (members advance one round per episode).
        :return: ``(M,)`` rows.
        """
        rounds = all_rounds[envs]
        groups = envs // self.group_size
        fresh = groups[rounds > self._newest[groups]]
        if self.group_size > 1:  # members of one group may begin the same round together
            fresh = np.unique(fresh)
        if fresh.size:
            newest = self._newest.copy()
            newest[fresh] += 1
            if self.group_size > 1:  # a lone env only ever needs its newest round
                oldest = all_rounds.reshape(self.num_groups, self.group_size).min(axis=1)
                self._fit(int((newest - oldest).max(initial=0)) + 1)  # rounds oldest..newest are still needed
            self._newest = newest
            cols = newest[fresh] % self._ring.shape[1]
            if self.task_seeds:
                self._ring[fresh, cols], self._seed_ring[fresh, cols] = self._draw_with_seeds(fresh)
            else:
                self._ring[fresh, cols] = self._draw(fresh)
        return self._ring[groups, rounds % self._ring.shape[1]]

    def upcoming(self, rounds: int = 1) -> np.ndarray:
        """The prompt rows of each group's next ``rounds`` rounds, the ones no member has begun yet, as the draws
        will give them (while the weights and seeds stay as they are), without taking a draw: ``(groups, rounds)``.

        A look ahead for a policy that prefills the prompts its envs will start soon. A group whose RNG was never
        seeded gets its random stream here, as its first draw would give it one.
        """
        out = np.empty((self.num_groups, rounds), dtype=np.int64)
        for k in range(self.num_groups):
            rng = self._rng(k)
            if self.cdf is None and not self.task_seeds:  # uniform: what is left of the block, then the next ones
                taken = self._draws[k, self._next_draw[k] :][:rounds]
                more = rounds - len(taken)
                ahead = copy.deepcopy(rng).integers(self.num_prompts, size=more) if more else taken[:0]
                out[k] = np.concatenate([taken, ahead])
                continue
            ahead = copy.deepcopy(rng)  # one round at a time, as _draw and _draw_with_seeds take them
            for r in range(rounds):
                out[k, r] = ahead.integers(self.num_prompts) if self.cdf is None else draw_weighted(ahead, self.cdf)
                if self.task_seeds:
                    ahead.integers(TASK_SEED_BOUND)
        return out

    def seeds(self, envs: np.ndarray, all_rounds: np.ndarray) -> np.ndarray:
        """The task seeds of the episodes ``envs`` begin now (after :meth:`rows` drew their rounds)."""
        groups = envs // self.group_size
        return self._seed_ring[groups, all_rounds[envs] % self._seed_ring.shape[1]]

    def _rng(self, k: int) -> np.random.Generator:
        if self.rngs[k] is None:
            self.rngs[k], _ = seeding.np_random()
        return self.rngs[k]

    def _draw_with_seeds(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next prompt and task seed of each of ``groups``, drawn one at a time as the single env draws them."""
        rows = np.empty(len(groups), dtype=np.int64)
        seeds = np.empty(len(groups), dtype=np.int64)
        for i, k in enumerate(groups.tolist()):
            rng = self._rng(k)
            rows[i] = rng.integers(self.num_prompts) if self.cdf is None else draw_weighted(rng, self.cdf)
            seeds[i] = rng.integers(TASK_SEED_BOUND)
        return rows, seeds

    def _draw(self, groups: np.ndarray) -> np.ndarray:
        """The next draw of each of ``groups`` (distinct), refilling the buffers that ran out."""
        if self.cdf is not None:  # weighted: one round at a time, as the single env draws
            return np.array([draw_weighted(self._rng(k), self.cdf) for k in groups.tolist()], dtype=np.int64)
        for k in groups[self._next_draw[groups] >= DRAW_BLOCK].tolist():
            if self.rngs[k] is None:
                self.rngs[k], _ = seeding.np_random()
            self._draws[k] = self.rngs[k].integers(self.num_prompts, size=DRAW_BLOCK)
            self._next_draw[k] = 0
        out = self._draws[groups, self._next_draw[groups]]
        self._next_draw[groups] += 1
        return out

    def _fit(self, span: int) -> None:
        """Grow the ring (doubling) to hold ``span`` consecutive rounds per group, keeping the ``R`` rounds up to
        each group's newest."""
        old = self._ring.shape[1]
        if span <= old:
            return
        new = old
        while new < span:
            new *= 2
        self._ring, self._seed_ring = (self._regrow(r, old, new) for r in (self._ring, self._seed_ring))

    def _regrow(self, ring: np.ndarray, old: int, new: int) -> np.ndarray:
        grown = np.zeros((self.num_groups, new), dtype=np.int64)
        for r in range(old):  # every live round keeps its slot modulo the new width
            rounds = self._newest - ((self._newest - r) % old)  # the live round at slot r in each group
            grown[np.arange(self.num_groups), rounds % new] = ring[:, r]
        return grown
