"""What each algorithm supports of the shared options, declared once on its class: :class:`Supports`.

Every algorithm of the package takes PPO's arguments and the skeleton's shared options (the keyword-only arguments of
:class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`), so its signature never lacks one and a user never gets a
``TypeError`` for a shared option. Which values it supports is its ``supports`` class attribute::

    class DAPO(GroupOnPolicyAlgorithm):
        supports = Supports(advantages=("group", "group_mean", "rloo", "self_critical"), reward_redistribution=())

A value it does not support is refused before anything is built, by a ``ValueError`` that names the algorithm, the
option and what to use instead (:meth:`Supports.check`). :func:`merged_signature` gives an algorithm's constructor the
signature it accepts: PPO's arguments and the shared options, typed once in the skeleton, with its own.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from sb3_grpo.common.advantages.forms import ADVANTAGE_FORMS, BUILT_IN_FORMS
from sb3_grpo.common.data_parallel import DATA_PARALLEL
from sb3_grpo.common.options.checks import check_argument_values, check_ppo_args, check_shared_args
from sb3_grpo.common.rollout.redistribution import REDISTRIBUTIONS
from sb3_grpo.engines import ENGINES, engine_name

__all__ = ["SHARED_OPTIONS", "SupportedOptions", "Supports", "evaluated_signature", "merged_signature"]

#: The shared options whose values an algorithm declares (:class:`Supports`'s fields), by argument name. The other
#: shared options (``grad_norm_warn``, ``nonfinite``, ``carry_over``) are the skeleton's, for every algorithm.
SHARED_OPTIONS = {
    "advantage": "advantages",
    "micro_batch_size": "micro_batches",
    "data_parallel": "data_parallel",
    "engine": "engines",
    "reward_redistribution": "reward_redistribution",
}


@dataclass(frozen=True)
class Supports:
    """The shared options an algorithm supports.

    :param advantages: The advantage forms it takes (names of
        :data:`~sb3_grpo.common.advantages.forms.ADVANTAGE_FORMS`).
    :param micro_batches: Whether it splits a minibatch into micro-batches (``micro_batch_size``): its loss of a
        micro-batch is the micro-batch's share of the minibatch's (``Minibatch.share``).
    :param data_parallel: The ``data_parallel`` modes it runs under ``torchrun``.
    :param engines: The rollout engines it runs (``engine``).
    :param reward_redistribution: The ``reward_redistribution`` rules it takes (``()``: none, which an algorithm
        without a critic declares: redistribution keeps each episode's total, all its advantages read).
    :param advantage_note: Why the forms beyond ``advantages`` are refused (the algorithm's own reason), for the
        message.
    """

    advantages: tuple[str, ...]
    micro_batches: bool = True
    data_parallel: tuple[str, ...] = DATA_PARALLEL
    engines: tuple[str, ...] = ENGINES
    reward_redistribution: tuple[str, ...] = REDISTRIBUTIONS
    advantage_note: str = ""

    def supported(self, option: str, value: Any) -> bool:
        """Whether ``option=value`` is supported (a shared option outside :data:`SHARED_OPTIONS` always is)."""
        if option == "advantage":
            return value in self.advantages
        if option == "micro_batch_size":
            return value is None or self.micro_batches
        if option == "data_parallel":
            return value in self.data_parallel
        if option == "engine":
            return engine_name(value) in self.engines
        if option == "reward_redistribution":
            return value is None or value in self.reward_redistribution
        return True

    def check(self, algorithm: str, args: Mapping[str, Any]) -> None:
        """Refuse each shared option in ``args`` whose value ``algorithm`` does not support (other keys are ignored);
        the values themselves are checked first (:func:`~sb3_grpo.common.options.checks.check_shared_args`).

        :param algorithm: The algorithm's name, for the message.
        :param args: Argument name -> value.
        :raises ValueError: naming the algorithm, the option, and what to use instead.
        """
        for option in SHARED_OPTIONS:
            if option in args and not self.supported(option, args[option]):
                raise ValueError(self._refusal(algorithm, option, args[option]))

    def _refusal(self, algorithm: str, option: str, value: Any) -> str:
        if option == "advantage":
            return self._advantage_refusal(algorithm, value)
        if option == "micro_batch_size":
            return (
                f"{algorithm} does not split a minibatch into micro-batches (micro_batch_size={value!r}): its loss has "
                "no micro-batch share; pass micro_batch_size=None (a smaller batch_size also lowers the update's "
                "memory), or use GRPO, which supports it"
            )
        if option == "reward_redistribution":
            return (
                f"{algorithm} does not take reward_redistribution={value!r}: it spreads an episode's reward over its "
                f"steps for a critic and GAE, and {algorithm} trains no critic (its advantages read each episode's "
                "total, which redistribution keeps), so it would change nothing; pass reward_redistribution=None, or "
                f"use GRPO(advantage='gae', reward_redistribution={value!r})"
            )
        name = engine_name(value) if option == "engine" else value
        supported = ", ".join(repr(v) for v in self._values(option))
        return f"{algorithm} does not support {option}={name!r}; use one of {supported}"

    def _values(self, option: str) -> tuple[Any, ...]:
        return self.engines if option == "engine" else self.data_parallel

    def _advantage_refusal(self, algorithm: str, value: str) -> str:
        form = ADVANTAGE_FORMS[value]
        if form.critic:
            return (
                f"{algorithm} trains no critic, so its advantage is a form without one: one of {self.advantages}, "
                f"got {value!r}; use GRPO(advantage={value!r}) or SB3's PPO for GAE"
            )
        note = f": {self.advantage_note}" if self.advantage_note else ""
        return (
            f"{algorithm} does not take advantage={value!r}{note}; use one of {self.advantages}, or "
            f"{form.owner}(advantage={value!r})"
        )


class SupportedOptions:
    """Mixed into :class:`~sb3_grpo.common.on_policy.GroupOnPolicyAlgorithm`: the algorithm's declaration
    (:attr:`supports`), the checks that read it (:meth:`check_arguments`, and ``load``'s), and the signature of a
    subclass's constructor, which takes PPO's arguments and the shared options through ``*args, **kwargs`` and lists
    them by name (:func:`merged_signature`), for users, the docs and the comparison's overrides."""

    #: The values of the shared options this algorithm supports; each algorithm declares its own.
    supports: ClassVar[Supports] = Supports(advantages=BUILT_IN_FORMS)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            parent = evaluated_signature(super(cls, cls).__init__)  # type: ignore[misc]
            cls.__init__.__signature__ = merged_signature(cls.__init__, parent)  # type: ignore[misc]

    @classmethod
    def check_arguments(cls, args: Mapping[str, Any]) -> None:
        """Check the constructor arguments in ``args`` (other keys are ignored), as the constructor does before it
        builds anything: PPO's (:func:`~sb3_grpo.common.options.checks.check_ppo_args`), the shared options
        (:func:`~sb3_grpo.common.options.checks.check_shared_args`) and whether this algorithm supports their values
        (:attr:`supports`). The comparison runs it on its hyperparameters.

        :raises TypeError: naming the first argument of a wrong type.
        :raises ValueError: naming the first argument with a wrong value, an option this algorithm does not support,
            or two that do not go together.
        """
        check_ppo_args(args)
        check_shared_args(args, cls.supports.advantages)
        cls.supports.check(cls.__name__, args)

    @classmethod
    def _check_load_arguments(cls, args: dict[str, Any]) -> None:
        """Check the arguments ``load`` sets (``kwargs``, ``custom_objects``) one by one, with the constructor's checks
        (:func:`~sb3_grpo.common.options.checks.check_argument_values`) and this algorithm's support of the shared
        options; a subclass with arguments of its own extends it.

        :raises TypeError: naming an argument of a wrong type.
        :raises ValueError: naming an argument with a wrong value, or an option this algorithm does not support.
        """
        check_argument_values(args)
        cls.supports.check(cls.__name__, args)


def merged_signature(init: Callable[..., Any], parent: inspect.Signature) -> inspect.Signature:
    """The signature an algorithm's constructor accepts: ``parent``'s (the skeleton's PPO arguments and shared options,
    or a parent algorithm's), with the keyword arguments ``init`` declares itself put in: a parent's argument it
    redeclares keeps its place with the new default, a new one joins the keyword-only arguments. ``init`` takes the
    parent's through ``*args`` and ``**kwargs``, which the merged signature lists by name instead.

    :param init: The constructor, ``(self, policy, env, *args, <own keyword arguments>, **kwargs)``.
    :param parent: The parent constructor's signature.
    """
    own = {
        name: p for name, p in evaluated_signature(init).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    params = [own.pop(name).replace(kind=p.kind) if name in own else p for name, p in parent.parameters.items()]
    last_positional = max(i for i, p in enumerate(params) if p.kind is not inspect.Parameter.KEYWORD_ONLY)
    params[last_positional + 1 : last_positional + 1] = list(own.values())
    return parent.replace(parameters=params)


def evaluated_signature(function: Callable[..., Any]) -> inspect.Signature:
    """``function``'s signature (its ``__signature__``, if it states one), its annotations evaluated in its own module,
    forward references inside them included (so that a merged signature names the same types whichever module reads
    it); as written where a name does not import at run time."""
    signature = inspect.signature(function)
    if "__signature__" in getattr(function, "__dict__", {}):
        return signature
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError):
        return signature
    return signature.replace(
        parameters=[p.replace(annotation=hints.get(name, p.annotation)) for name, p in signature.parameters.items()]
    )
