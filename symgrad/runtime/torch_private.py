"""The private torch APIs of the generated PyTorch modules, each with its fallback.

A private API can change or vanish in any torch release: each one is used here alone,
behind a name that falls back to what is always safe where this torch lacks it (the
generated code is then slower, never wrong). tests/test_runtime.py tests each fallback.
Copied into the generated modules with the helpers that use them.
"""

from __future__ import annotations

import torch

# Private torch APIs, each with its fallback (symgrad/runtime/torch_private.py).

#: Whether a functorch transform (vmap, grad, ...) is running: no in-place tricks then.
#: (torch._C; where it is missing, one is taken to be running.)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def _recompile_limit_hit(error: Exception) -> bool:
    """Whether ``error`` is dynamo's refusal of a compiled version past its recompile
    limit under fullgraph=True (torch._dynamo.exc.FailOnRecompileLimitHit; never, where
    this torch has no such error)."""
    return isinstance(error, getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ()))


def _mark_dynamic_hinted(tensor: torch.Tensor, dim: int, hint: int) -> bool:
    """Mark ``tensor``'s dimension ``dim`` dynamic, with ``hint`` as the size compiled
    code is tuned for (torch._dynamo.mark_dynamic); False, with nothing marked, where
    this torch has no ``hint_override`` (2.8 and older)."""
    try:
        torch._dynamo.mark_dynamic(tensor, dim, hint_override=hint)
    except TypeError:
        return False
    return True
