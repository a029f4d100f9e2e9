"""The width tile of a channels-last convolution's register block
(:func:`stagegraph.stages.x86.generic.plan.width_above_cap`): a static divisor of the width
that fell to half its cap or less moves above the cap when that is nearer and the
registers hold its accumulators (the register-blocked plans themselves:
``test_generic_schedule.py::test_channels_last_convolution_is_register_blocked``)."""

from __future__ import annotations


def test_a_width_tile_at_half_its_cap_moves_above_it_within_the_registers():
    """A width of 10 at a cap of 4 takes 5 (nearer than 2) when 5 columns' accumulators
    fit; not with room for 4; a tile over half the cap (5 at 8) or none nearer above (22
    at 4: 11) stays."""
    from stagegraph.stages.x86.generic.plan import width_above_cap

    assert width_above_cap(10, 2, 4, 14) == 5
    assert width_above_cap(10, 2, 4, 4) == 2
    assert width_above_cap(10, 5, 8, 30) == 5
    assert width_above_cap(22, 2, 4, 14) == 2
