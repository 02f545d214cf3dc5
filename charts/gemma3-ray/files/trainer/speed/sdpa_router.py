"""One wrapper over Transformers' SDPA attention function, sending each call to the kernel its module is routed to.

Transformers' models call ``ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, ...)`` for
every attention layer. Two levers want another kernel there: SigLIP's attention through FlashAttention 4
(``fa4_attention``, route ``fa4``) and the language model's grouped-kv attention through cuDNN (``lm_attention``,
route ``cudnn_gqa``). Neither replaces the function: each marks its modules with its route's name and registers the
route's kernel here (`route`), and this module installs one wrapper, once. Per call the wrapper looks up the
calling module's route and runs that kernel, which either runs the call or declines it (returns None: a mask,
dropout or a dtype it does not take); everything else (other models, unmarked modules, declined calls) runs the
function the wrapper replaced, unchanged. `remove` puts that function back. Transformers is imported inside
functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ROUTE = "_gemma3_ray_sdpa_route"  # the module attribute naming its route
INSTALLED = "_gemma3_ray_sdpa_router"  # marks the wrapper
KERNELS: dict[str, Callable[..., Any]] = {}  # route -> kernel(module, query, key, value, attention_mask, **kw)


def route(modules, name: str, kernel: Callable[..., Any]) -> int:
    """Send the attention calls of `modules` to `kernel` (registered as route `name`); returns how many modules."""
    KERNELS[name] = kernel
    count = 0
    for module in modules:
        setattr(module, ROUTE, name)
        count += 1
    install()
    return count


def _attention_functions():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS


def install() -> Callable[..., Any]:
    """The router in Transformers' "sdpa" slot (installed once; a second call finds it); returns it."""
    functions = _attention_functions()
    current = functions["sdpa"]
    if getattr(current, INSTALLED, False):
        return current
    original = current

    def sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
             **kwargs: Any):
        kernel = KERNELS.get(getattr(module, ROUTE, None))
        if kernel is not None:
            out = kernel(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
            if out is not None:
                return out
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)

    setattr(sdpa, INSTALLED, True)
    sdpa.original = original  # type: ignore[attr-defined]
    functions["sdpa"] = sdpa
    return sdpa


def remove() -> bool:
    """Put back the function the router replaced; False when it was not installed."""
    functions = _attention_functions()
    current = functions["sdpa"]
    if not getattr(current, INSTALLED, False):
        return False
    functions["sdpa"] = current.original
    return True
