"""Which limits an MPS daemon holds for the shares placed on it (one server serves them all)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hostagent.mps import MpsLimits, daemon_limits, enforced_by_daemon, share_limits

UNSET = MpsLimits()


def test_a_lone_share_is_held_to_its_own_limits_by_the_daemon():
    share = MpsLimits(30, 4096)
    daemon = daemon_limits(UNSET, [share])
    assert daemon == MpsLimits(30, 4096)
    assert enforced_by_daemon(daemon, share, UNSET)


def test_shares_that_ask_the_same_are_all_held_by_the_daemon():
    shares = [MpsLimits(25, 2048), MpsLimits(25, 2048)]
    daemon = daemon_limits(UNSET, shares)
    assert all(enforced_by_daemon(daemon, s, UNSET) for s in shares)


def test_unequal_shares_get_the_largest_of_each_and_the_smaller_ones_are_not_held_by_it():
    small, large = MpsLimits(10, 1024), MpsLimits(40, 8192)
    daemon = daemon_limits(UNSET, [small, large])
    assert daemon == MpsLimits(40, 8192)
    assert enforced_by_daemon(daemon, large, UNSET)
    assert not enforced_by_daemon(daemon, small, UNSET)


def test_a_share_without_a_compute_cap_takes_the_operators_setting():
    setting = MpsLimits(60, None)
    assert share_limits(setting, MpsLimits(None, 2048)) == MpsLimits(60, 2048)
    assert daemon_limits(setting, [MpsLimits(None, 2048)]) == MpsLimits(60, 2048)
    assert daemon_limits(UNSET, [MpsLimits(None, 2048)]) == MpsLimits(100, 2048)


def test_a_share_without_memory_lifts_the_memory_limit_up_to_the_setting():
    lifted = daemon_limits(UNSET, [MpsLimits(20, 1024), MpsLimits(20, None)])
    assert lifted.pinned_mem_limit_mib is None
    setting = MpsLimits(None, 8192)
    assert daemon_limits(setting, [MpsLimits(20, None)]).pinned_mem_limit_mib == 8192


def test_without_shares_the_daemon_takes_the_setting_and_keeps_a_memory_limit_it_holds():
    assert daemon_limits(MpsLimits(50, None), []) == MpsLimits(50, None)
    assert daemon_limits(MpsLimits(50, None), [], MpsLimits(30, 2048)) == MpsLimits(50, 2048)
    assert daemon_limits(MpsLimits(50, 4096), [], MpsLimits(30, 2048)) == MpsLimits(50, 4096)


limits = st.builds(MpsLimits, st.none() | st.integers(1, 100), st.none() | st.integers(1, 1 << 20))


@given(setting=limits, shares=st.lists(limits, min_size=1, max_size=8))
def test_the_daemon_never_holds_a_share_below_its_own_nor_above_the_setting(setting, shares):
    daemon = daemon_limits(setting, shares).normalized()
    base = setting.normalized()
    assert daemon.active_thread_percentage is not None
    assert daemon.active_thread_percentage <= (base.active_thread_percentage or 100)
    for share in shares:
        own = share_limits(setting, share)
        assert own.active_thread_percentage is not None
        assert daemon.active_thread_percentage >= own.active_thread_percentage
        if daemon.pinned_mem_limit_mib is not None:
            assert own.pinned_mem_limit_mib is not None
            assert daemon.pinned_mem_limit_mib >= own.pinned_mem_limit_mib
    if len(set(shares)) == 1:
        assert enforced_by_daemon(daemon, shares[0], setting)
