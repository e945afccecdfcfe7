"""Probing what an installed FlashInfer accepts, from signatures (vLLM's ``supports_kw``)."""

from __future__ import annotations

import inspect
from typing import Callable

# Not POSITIONAL_ONLY, which vLLM's supports_kw counts: passing one by name is a TypeError.
_PASSABLE_BY_NAME = (
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)


def supports_kw(callable: Callable[..., object], kw_name: str, *,
                requires_kw_only: bool = False, allow_var_kwargs: bool = True) -> bool:
    """Whether ``callable`` accepts the keyword argument ``kw_name``.

    Parameters
    ----------
    callable : Callable
        Bound methods are unwrapped to their function (the ``self`` parameter does not
        change the answer).
    kw_name : str
    requires_kw_only : bool
        Only a keyword-only parameter counts (one that could also be passed positionally
        does not).
    allow_var_kwargs : bool
        A trailing ``**kwargs`` (not itself named ``kw_name``) counts as accepting it.

    Returns
    -------
    bool

    Raises
    ------
    TypeError, ValueError
        From :func:`inspect.signature` when ``callable`` has no inspectable signature; the
        caller decides what that means.
    """
    fn = getattr(callable, "__func__", callable)
    params = inspect.signature(fn).parameters
    if not params:
        return False
    param = params.get(kw_name)
    if param is not None and param.kind in _PASSABLE_BY_NAME:
        if requires_kw_only:
            return param.kind == inspect.Parameter.KEYWORD_ONLY
        return True
    if allow_var_kwargs:
        last = list(params.values())[-1]
        return last.kind == inspect.Parameter.VAR_KEYWORD and last.name != kw_name
    return False
