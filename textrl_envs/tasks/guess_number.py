"""``GuessNumber-v0``: find a secret number; the environment answers every guess (an interactive task)."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import GUESS_NUMBER


class GuessNumberEnv(TextGenEnv):
    """Guess a secret integer from 1 to 8; after each guess the environment says higher, lower or correct.

    The smallest multi-turn task: the agent has to read the environment's answers, which are part of its
    observation, and use them in its next turn. Binary search finds any secret in at most 4 turns.

    ## Description
    Each episode draws a secret uniformly from 1-8 (:class:`~textrl_envs.tasks.interactions.GuessNumber`). The
    prompt is ``"Guess 1-8: x="``; the agent writes a number and ends its turn with EOS (the bundled LM answers
    ``x=`` with a number and EOS). The environment appends ``"Higher. x="`` or ``"Lower. x="`` to the observation,
    or ``"Correct!"`` and the episode ends. A turn's guess is the first integer in its text; a turn without one
    gets ``"Say a number. x="`` and is wasted. The range is 1-8 rather than 1-16 because the bundled LM writes
    a two-digit number after ``x=`` in under 5% of its samples: over 1-16, RL would have almost nothing to
    reinforce for 7 of the 16 secrets. A prompt of your own sets another range (see Starting State).

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the agent's next token. The agent acts only its own tokens; the
    environment's replies are written into the observation in the step that ends the agent's turn.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``12 + 48 = 60``): the prompt, then the conversation
    (the agent's turns and the replies), right-aligned, pad on the left with mask 0.

    ## Rewards
    On the step whose guess is right: ``max(0, 1 - 0.1 * (turn - 1))`` (1 on the first turn, 0.7 on the
    fourth). 0 on every other step, and 0 in total when the turns run out.

    ## Starting State
    The prompt, and a secret drawn with a generator seeded by one draw of the env's ``np_random`` per episode
    (after the prompt's), so ``reset(seed=s)`` repeats an episode and the members of a prompt group
    (``group_size=G``) play the same secret. Prompts of your own set the range with metadata:
    ``prompts=[{"prompt": "Guess 1-16: x=", "low": 1, "high": 16}]``.

    ## Episode End
    A turn ends at EOS or after ``max_turn_tokens = 3`` tokens. Terminated at the right guess; truncated after
    ``max_turns = 4`` turns, or when ``max_new_tokens = 48`` tokens (every token after the prompt, the replies'
    included) are spent. The final ``info`` holds ``prompt``, ``completion`` (the conversation after the
    prompt), ``completion_ids``, ``prompt_index``, ``reward``, ``turns`` (turns taken) and ``transcript``
    (``[{"role": "env" | "agent", "text": str}, ...]``).

    ## Arguments
    ``gym.make("GuessNumber-v0", max_turns=4, max_turn_tokens=3, turn_end=None, max_new_tokens=48,
    max_prompt_tokens=12, prompts=None, tokenizer=None, interaction=None, reward=None, reward_timeout=600.0,
    render_mode=None)``. ``interaction=GuessNumber(low, high, turn_penalty)`` changes the game; ``reward=`` adds an
    end-of-episode score of the conversation (see :class:`~textrl_envs.env.TextGenEnv`).

    ``instruct=True`` (an instruct model, e.g. ``tokenizer="smollm2-135m-instruct"``; :mod:`textrl_envs.instruct`)
    states the game's rules in a chat; a turn's guess is the number it states (``Answer: 4``, else its last
    number), and the replies are the sentences ``"Higher."``, ``"Lower."``, ``"Correct!"`` as user messages
    (:class:`~textrl_envs.tasks.interactions.GuessNumber` with ``chat=True``). Budgets: 4 turns of up to 32 tokens,
    ``max_new_tokens=192``, ``max_prompt_tokens=112``.

    ## Vectorized environment
    ``gym.make_vec("GuessNumber-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`, which answers every turn that ended in a step with one call
    and equals ``SyncVectorEnv`` over ``gym.make`` envs; a group's members play the same secret.

    ## Version History
    * v0: Initial version.
    """

    default_task = GUESS_NUMBER.env_id
