"""Auto-wrap policies for FSDPv2 (PyTorch/XLA's ``torch_xla.distributed.fsdp.wrap``).

A policy is called as ``policy(module, recurse, unwrapped_params)``: with ``recurse=True`` it says
whether to look inside ``module``; with ``recurse=False`` whether to wrap it. Policies are called
with positional arguments, so torch's own (``torch.distributed.fsdp.wrap.transformer_auto_wrap_policy``,
whose third parameter is named ``nonwrapped_numel``) work too. Pure torch: no device is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch.nn as nn

__all__ = [
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Wrap every submodule (and look inside every one)."""
    return True


def lambda_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                            lambda_fn: Callable[[nn.Module], bool]) -> bool:
    """Look inside every module; wrap those for which ``lambda_fn(module)`` is true.

    Example::

        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, Block))
    """
    return True if recurse else bool(lambda_fn(module))


def transformer_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                                 transformer_layer_cls: Collection[type[nn.Module]]) -> bool:
    """Look inside every module; wrap the instances of ``transformer_layer_cls`` (the layer classes).

    Parameters outside those layers (embeddings, the final norm) stay with the outer wrapper.

    Example::

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        model = SpmdFullyShardedDataParallel(model, mesh=mesh, auto_wrap_policy=policy)
    """
    return True if recurse else isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: Collection[type[nn.Module]] | None = None,
    exclude_wrap_modules: Collection[type[nn.Module]] | None = None,
) -> bool:
    """Wrap modules holding at least ``min_num_params`` parameters not yet wrapped.

    Never looks inside ``force_leaf_modules`` (default :attr:`FORCE_LEAF_MODULES`:
    ``nn.MultiheadAttention``) and never wraps ``exclude_wrap_modules`` (default
    :attr:`EXCLUDE_WRAP_MODULES`: ``nn.ModuleList``, ``nn.ModuleDict``, which have no forward).
    """
    defaults: Any = size_based_auto_wrap_policy  # the defaults are attributes of the function, as in torch_xla
    leaves = defaults.FORCE_LEAF_MODULES if force_leaf_modules is None else force_leaf_modules
    excluded = defaults.EXCLUDE_WRAP_MODULES if exclude_wrap_modules is None else exclude_wrap_modules
    if unwrapped_params < min_num_params:
        return False
    return not isinstance(module, tuple(leaves if recurse else excluded))


size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}  # type: ignore[attr-defined]
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}  # type: ignore[attr-defined]


def recursive_wrap(
    module: nn.Module,
    auto_wrap_policy: Callable[..., bool],
    wrapper_cls: Callable[..., nn.Module],
    ignored_modules: Collection[nn.Module],
    ignored_params: Collection[nn.Parameter],
    only_wrap_children: bool = False,
    **kwargs: Any,
) -> tuple[nn.Module, int]:
    """Wrap the submodules of ``module`` the policy picks, innermost first; returns ``(module, params wrapped)``.

    Children are replaced in place (``setattr``); ``module`` itself is wrapped too unless
    ``only_wrap_children``. ``kwargs`` go to ``wrapper_cls`` (a module's ``_wrap_overrides``
    dict, if it has one, overrides them for that module). Modules in ``ignored_modules`` are
    left alone and parameters in ``ignored_params`` are not counted.
    """
    ignored = {id(m) for m in ignored_modules}
    ignored_p = {id(p) for p in ignored_params}
    if isinstance(wrapper_cls, type):
        for name, child in module.named_modules():
            if id(child) not in ignored and isinstance(child, wrapper_cls):
                raise ValueError(f"{name or 'the module'} is already wrapped in {wrapper_cls.__name__}; "
                                 "auto-wrapping does not wrap twice")
    total = sum(p.numel() for p in module.parameters() if id(p) not in ignored_p)
    if not auto_wrap_policy(module, True, total):
        return module, 0
    wrapped = 0
    for name, child in list(module.named_children()):
        if id(child) in ignored:
            continue
        new_child, count = recursive_wrap(child, auto_wrap_policy, wrapper_cls, ignored_modules, ignored_params,
                                          **kwargs)
        if new_child is not child:
            setattr(module, name, new_child)
        wrapped += count
    if not only_wrap_children and auto_wrap_policy(module, False, total - wrapped):
        options = {**kwargs, **getattr(module, "_wrap_overrides", {})}
        return wrapper_cls(module, **options), total
    return module, wrapped
