"""The op tables refuse a second rule for an operator (lowering, meta rule, decomposition): no silent overwrite."""

from __future__ import annotations

import pytest
import torch

from pjrt_plugins.errors import PjrtPluginsError
from pjrt_plugins.spmd.lowering import LOWERINGS, META_RULES
from pjrt_plugins.spmd.lowering._composites import COMPOSITES, _composite
from pjrt_plugins.spmd.lowering._table import DuplicateRegistrationError, lowers, meta_rule

aten = torch.ops.aten


def _second_add(em, out, a, b):
    raise AssertionError("never registered")


def test_a_second_lowering_names_both_functions_and_keeps_the_first():
    first = LOWERINGS[aten.add.Tensor]
    with pytest.raises(DuplicateRegistrationError) as info:
        lowers(aten.add.Tensor)(_second_add)
    message = str(info.value)
    assert "aten.add.Tensor has two lowerings" in message
    assert first.__qualname__ in message and "_elementwise.py:" in message  # the earlier rule and where it is
    assert "_second_add" in message and "test_lowering_table.py:" in message  # the new one and where it is
    assert LOWERINGS[aten.add.Tensor] is first
    assert isinstance(info.value, PjrtPluginsError)


def test_a_refused_registration_registers_none_of_its_ops():
    assert aten.sin.out not in LOWERINGS
    with pytest.raises(DuplicateRegistrationError, match="aten.cos.default has two lowerings"):
        lowers(aten.sin.out, aten.cos.default)(_second_add)
    assert aten.sin.out not in LOWERINGS


def test_an_op_listed_twice_in_one_registration_is_refused():
    with pytest.raises(DuplicateRegistrationError, match="aten.sin.out is listed twice"):
        lowers(aten.sin.out, aten.sin.out)(_second_add)
    assert aten.sin.out not in LOWERINGS


def test_a_second_meta_rule_is_refused():
    first = META_RULES[aten.as_strided.default]
    with pytest.raises(DuplicateRegistrationError, match="aten.as_strided.default has two meta rules"):
        meta_rule(aten.as_strided.default)(lambda *args: None)
    assert META_RULES[aten.as_strided.default] is first


def test_a_second_decomposition_of_ours_is_refused():
    first = COMPOSITES[aten.native_batch_norm.default]
    with pytest.raises(DuplicateRegistrationError, match="native_batch_norm.default has two decompositions"):
        _composite(aten.native_batch_norm.default)(lambda *args: None)
    assert COMPOSITES[aten.native_batch_norm.default] is first


def test_only_operator_overloads_are_registered():
    with pytest.raises(TypeError, match="register overloads"):
        lowers(aten.add)(_second_add)  # the packet, not an overload


def test_the_tables_hold_no_op_twice_across_tables():
    """A decomposition of ours for a hand-lowered op would never run; the package refuses it at import."""
    assert not set(COMPOSITES) & set(LOWERINGS)
