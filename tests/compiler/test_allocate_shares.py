"""allocate/shares.py: the shares plan_shares visits, found from the maximal shares left, are the ones (in
the same order) that listing every share and skipping the covered and hopeless ones gives; with a device
limit on a fleet, the probes over it leave no share within it unplanned or not ruled out."""

from __future__ import annotations

import logging
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from edgec.compiler.allocate import shares as shares_mod
from edgec.compiler.allocate.shares import Shares, every_share


def _run(seed, share):
    """A made-up planner run on `share`, drawn from the seed and the share (so every walk sees the same runs):
    (the devices its plan uses or None, whether it meets the SLA)."""
    rng = random.Random(f"{seed}:{share}")
    used = tuple(rng.randint(0, x) if rng.random() < 0.5 else min(x, rng.randint(0, 1)) for x in share)
    planned = rng.random() < 0.9
    return (used if planned else None), planned and rng.random() < 0.7


def _visit(sizes, limit, seed, listed: bool, monkeypatch) -> list[tuple[int, ...]]:
    """plan_shares' loop with made-up planner runs (`_run`)."""
    monkeypatch.setattr(shares_mod, "LISTED", math.inf if listed else 0)
    seq, shares = [], Shares(sizes, limit)
    while (share := shares.next()) is not None:
        seq.append(share)
        used, meets = _run(seed, share)
        if not meets:
            shares.hopeless(share)
        if used is not None:
            shares.cover(used, share)
    return seq


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 4), min_size=1, max_size=4).filter(lambda s: sum(s) > 0),
       limit_frac=st.sampled_from([None, 1.0]), seed=st.integers(0, 10**6))
def test_the_maximal_shares_visit_what_the_full_list_visits(sizes, limit_frac, seed):
    import pytest

    limit = math.inf if limit_frac is None else max(1, round(limit_frac * sum(sizes)))
    with pytest.MonkeyPatch.context() as mp:
        listed = _visit(tuple(sizes), limit, seed, True, mp)
        frontier = _visit(tuple(sizes), limit, seed, False, mp)
    assert frontier == listed


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 4), min_size=1, max_size=5).filter(lambda s: sum(s) > 1),
       limit_frac=st.sampled_from([0.2, 0.3, 0.6, 0.9]), seed=st.integers(0, 10**6))
def test_with_a_limit_the_probes_leave_no_share_within_it_unplanned(sizes, limit_frac, seed):
    """Beyond LISTED shares with a device limit, the walk probes shares over it (shares.py): every share within
    the limit is then planned, or in the box [used, share] of a run whose plan is within the limit, or under a
    share that misses the SLA; and the shares come largest first."""
    import pytest

    sizes = tuple(sizes)
    limit = max(1, round(limit_frac * sum(sizes)))
    with pytest.MonkeyPatch.context() as mp:
        seq = _visit(sizes, limit, seed, False, mp)
    assert [-sum(c) for c in seq] == sorted(-sum(c) for c in seq)
    runs = {c: _run(seed, c) for c in seq}
    le = lambda a, b: all(x <= y for x, y in zip(a, b))  # noqa: E731
    for share in every_share(sizes, limit):
        assert share in runs or any(
            (used is not None and sum(used) <= limit and le(used, share) and le(share, w))
            or (not meets and le(share, w)) for w, (used, meets) in runs.items()), share


def test_a_limit_on_a_fleet_plans_the_classes_not_the_shares_within_it():
    """100 devices of 8 kinds (4 of each offered) and max_devices 8: 5,475 shares of 8 devices, no box of one
    holding another. When every plan uses one device, of the first class its share has, the walk plans the whole
    cluster and then the cluster without each class in turn: 8 runs."""
    shares, seen = Shares((4,) * 8, 8), []
    while (share := shares.next()) is not None:
        seen.append(share)
        first = next(c for c, n in enumerate(share) if n)
        shares.cover(tuple(int(c == first) for c in range(8)), share)
    assert seen == [(0,) * c + (4,) * (8 - c) for c in range(8)]


def test_nothing_ruled_out_visits_every_share_in_order(monkeypatch):
    monkeypatch.setattr(shares_mod, "LISTED", 0)
    shares, seen = Shares((2, 1, 3), 4), []
    while (share := shares.next()) is not None:
        seen.append(share)
        shares.cover(share, share)
    assert seen == [(2, 1, 3)] + every_share((2, 1, 3), 4)  # the probe of the whole cluster, over the limit, first


def test_a_fleet_of_a_billion_shares_is_never_listed():
    """100 devices of 8 kinds: about 1.1 billion shares. The first is the whole cluster; a plan on it using one
    edge server covers every share holding one, so the next is the whole cluster without the edge servers."""
    sizes = (13, 13, 13, 13, 12, 12, 12, 12)
    assert math.prod(s + 1 for s in sizes) > 10**9
    shares = Shares(sizes, math.inf)
    assert shares.next() == sizes
    shares.cover((0,) * 7 + (1,), sizes)
    assert shares.next() == sizes[:7] + (0,)
    shares.hopeless(sizes[:7] + (0,))  # nothing without an edge server meets the SLA
    assert shares.next() is None


def test_a_fleet_offers_at_most_class_cap_devices_of_a_class():
    from edgec.compiler.allocate.shares import CLASS_CAP, LISTED, offered

    assert offered((3, 2, 5)) == ((3, 2, 5), False)  # few shares: every device
    fleet = (13, 13, 13, 13, 12, 12, 12, 12)
    assert math.prod(s + 1 for s in fleet) > LISTED
    assert offered(fleet) == ((CLASS_CAP,) * 8, True)
    assert offered((1,) * 20) == ((1,) * 20, False)  # over LISTED, but no class is larger than the cap


def test_each_share_plans_its_searches_within_share_nodes():
    """A share's planner run gets the smaller of the caller's spatial node budget and SHARE_NODES."""
    from edgec.compiler.allocate import candidates

    assert candidates._share_nodes(None) == candidates.SHARE_NODES
    assert candidates._share_nodes(10**9) == candidates.SHARE_NODES
    assert candidates._share_nodes(7) == 7


def _padded_by_listing(used, sizes, minimum):
    """The definition: every share holding `used` with `minimum` devices, in counts order."""
    import itertools

    if sum(used) >= minimum:
        return [used]
    return [c for c in itertools.product(*(range(u, s + 1) for u, s in zip(used, sizes))) if sum(c) == minimum]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=4).flatmap(
    lambda sizes: st.tuples(st.just(tuple(sizes)), st.tuples(*(st.integers(0, s) for s in sizes)),
                            st.integers(0, sum(sizes)))))
def test_padding_up_to_min_devices_is_its_definition(case):
    from edgec.compiler.allocate.candidates import _padded

    sizes, used, minimum = case
    assert _padded(used, sizes, minimum, limit=10**9) == _padded_by_listing(used, sizes, minimum)


def test_padding_on_a_fleet_stops_at_its_limit(caplog, monkeypatch):
    """100 devices of 8 kinds and min_devices 40: billions of mixes by listing; the first PAD_MIXES, said."""
    from edgec.compiler.allocate.candidates import PAD_MIXES, _padded, logger

    # Heard here whatever logging set-up an earlier test in this process left behind (levels, propagation).
    monkeypatch.setattr(logger, "disabled", False)
    caplog.set_level(logging.WARNING, logger=logger.name)
    logger.addHandler(caplog.handler)
    try:
        out = _padded((1,) + (0,) * 7, (13,) * 4 + (12,) * 4, 40)
    finally:
        logger.removeHandler(caplog.handler)
    assert len(out) == PAD_MIXES and all(sum(c) == 40 for c in out) and out == sorted(out)
    assert "padded in its first" in caplog.text
