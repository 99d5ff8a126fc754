"""The compute parties' signatures over an owner's release (parties.owner.attest): every party's
signature verifies over the bytes the owner read; a release altered in any field the statement
covers (a value, the round, the owners counted or refused, the shape, the job) or a signature
swapped, truncated or missing is named; an owner left out after its share was acknowledged, or
counted without sending, stops naming why."""

from __future__ import annotations

import pytest
import torch

from parties.owner.attest import (
    ReleaseSigner,
    Roster,
    UncountedContribution,
    UnsignedRelease,
    check_release,
    statement,
    uncounted,
    unsigned,
)

OWNERS = 1000
ROSTER = Roster.of(OWNERS, [o for o in range(OWNERS) if o % 20], [40, 60])  # 950 counted, two refused


def _signed(state: torch.Tensor) -> tuple[list[bytes], list[bytes], bytes]:
    signers = [ReleaseSigner() for _ in range(3)]
    stmt = statement("job-1", 4, state, ROSTER)
    return [s.public for s in signers], [s.sign(stmt) for s in signers], stmt


def test_every_signature_verifies_over_the_release_read() -> None:
    state = torch.randn(7850, dtype=torch.float64)
    keys, sigs, stmt = _signed(state)
    assert unsigned(keys, stmt, sigs) == []
    assert unsigned(keys, statement("job-1", 4, state.clone(), Roster(ROSTER.counted, ROSTER.refused)), sigs) == []
    assert ROSTER.count == 950 and ROSTER.refused_count == 2 and len(ROSTER.counted) == 125


def test_an_altered_release_is_signed_by_nobody() -> None:
    state = torch.randn(100, dtype=torch.float64)
    keys, sigs, _stmt = _signed(state)
    flipped = state.clone()
    flipped.view(torch.int64)[17] ^= 1  # one bit of one value
    one_out = [o for o in range(OWNERS) if o % 20 and o != 7]  # owner 7 left out, the count one less
    swapped = [o for o in range(OWNERS) if o % 20 and o != 7] + [20]  # owner 7 swapped for owner 20: the same count
    for other in (statement("job-1", 4, flipped, ROSTER), statement("job-1", 5, state, ROSTER),
                  statement("job-1", 4, state, Roster.of(OWNERS, one_out, [40, 60])),
                  statement("job-1", 4, state, Roster.of(OWNERS, swapped, [40, 60])),
                  statement("job-1", 4, state, Roster.of(OWNERS, one_out, [7, 40, 60])),  # called refused instead
                  statement("job-2", 4, state, ROSTER), statement("job-1", 4, state.reshape(10, 10), ROSTER)):
        assert unsigned(keys, other, sigs) == [0, 1, 2]


def test_a_missing_swapped_or_truncated_signature_names_its_party() -> None:
    keys, sigs, stmt = _signed(torch.zeros(5, dtype=torch.float64))
    assert unsigned(keys, stmt, sigs[:2]) == [2]
    assert unsigned(keys, stmt, [sigs[1], sigs[0], sigs[2]]) == [0, 1]
    assert unsigned(keys, stmt, [sigs[0], sigs[1][:63], sigs[2]]) == [1]
    assert unsigned([keys[0], b"short", keys[2]], stmt, sigs) == [1]


def test_a_signed_roster_must_agree_with_its_count_and_with_what_the_owner_sent() -> None:
    """The count a release is served with is its signed roster's; an owner whose share its explicit
    party acknowledged must be counted or refused, and one that sent nothing must not be counted."""
    state = torch.randn(10, dtype=torch.float64)
    keys, sigs, _ = _signed(state)
    names = ["alice", "bob", "carol"]
    check_release(keys, names, "job-1", 4, state, 950, ROSTER, sigs, "read from bob")
    with pytest.raises(UnsignedRelease, match="states 951 owners counted, its signed roster 950"):
        check_release(keys, names, "job-1", 4, state, 951, ROSTER, sigs, "read from bob")
    uncounted(ROSTER, 1, True, "bob", 4)  # counted
    uncounted(ROSTER, 40, True, "bob", 4)  # refused: told, not a deviation it can see
    uncounted(ROSTER, 20, False, "bob", 4)  # late: not counted
    with pytest.raises(UncountedContribution, match="round 4: bob acknowledged this owner's share, but the release"):
        uncounted(ROSTER, 20, True, "bob", 4)
    with pytest.raises(UncountedContribution, match="counts a share of this owner, which sent none"):
        uncounted(ROSTER, 1, False, "bob", 4)
    with pytest.raises(ValueError, match="owner index 1000 outside the job's 1000 owners"):
        Roster.of(OWNERS, [1000])
