"""Pairs of a diffusion model and the autoregressive model its EDLM and DCD steps consult: held here, by the
diffusion model (weakly: a pair ends with its diffusion model), never written onto it."""

import weakref

from .base import kind_of

_COMPANIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def pair(model, ar_model) -> None:
    """Make ``ar_model`` the autoregressive model that EDLM and DCD steps of ``model`` (a masked diffusion model of
    the same vocabulary and length) consult. Raises ValueError for models that do not fit."""
    if not kind_of(ar_model.cfg).companion or not kind_of(model.cfg).takes_companion:
        raise ValueError("pair a masked diffusion model with an autoregressive one")
    d, a = model.cfg.dit, ar_model.cfg.dit
    if (d.vocab_size, d.out_vocab, d.length) != (a.vocab_size, a.out_vocab, a.length):
        raise ValueError(f"the autoregressive model's vocabulary and length ({a.out_vocab}, {a.length}) differ "
                         f"from the diffusion model's ({d.out_vocab}, {d.length})")
    _COMPANIONS[model] = ar_model  # held as long as ``model`` lives, as an attribute of it would be


def unpair(model) -> None:
    """Forget ``model``'s companion, if any."""
    _COMPANIONS.pop(model, None)


def companion(model):
    """The autoregressive model paired with ``model`` (``pair``), or None."""
    return _COMPANIONS.get(model)
