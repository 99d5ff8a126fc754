"""The compute parties' signatures over an owner's release (parties.owner.attest): every party's
signature verifies over the bytes the owner read; a release altered in any field the statement
covers (a value, the round, the owners counted, the shape, the job) or a signature swapped,
truncated or missing is named."""

from __future__ import annotations

import torch

from parties.owner.attest import ReleaseSigner, statement, unsigned


def _signed(state: torch.Tensor) -> tuple[list[bytes], list[bytes], bytes]:
    signers = [ReleaseSigner() for _ in range(3)]
    stmt = statement("job-1", 4, state, 950)
    return [s.public for s in signers], [s.sign(stmt) for s in signers], stmt


def test_every_signature_verifies_over_the_release_read() -> None:
    state = torch.randn(7850, dtype=torch.float64)
    keys, sigs, stmt = _signed(state)
    assert unsigned(keys, stmt, sigs) == []
    assert unsigned(keys, statement("job-1", 4, state.clone(), 950), sigs) == []  # the bytes, not the object


def test_an_altered_release_is_signed_by_nobody() -> None:
    state = torch.randn(100, dtype=torch.float64)
    keys, sigs, _stmt = _signed(state)
    flipped = state.clone()
    flipped.view(torch.int64)[17] ^= 1  # one bit of one value
    for other in (statement("job-1", 4, flipped, 950), statement("job-1", 5, state, 950),
                  statement("job-1", 4, state, 951), statement("job-2", 4, state, 950),
                  statement("job-1", 4, state.reshape(10, 10), 950)):
        assert unsigned(keys, other, sigs) == [0, 1, 2]


def test_a_missing_swapped_or_truncated_signature_names_its_party() -> None:
    keys, sigs, stmt = _signed(torch.zeros(5, dtype=torch.float64))
    assert unsigned(keys, stmt, sigs[:2]) == [2]
    assert unsigned(keys, stmt, [sigs[1], sigs[0], sigs[2]]) == [0, 1]
    assert unsigned(keys, stmt, [sigs[0], sigs[1][:63], sigs[2]]) == [1]
    assert unsigned([keys[0], b"short", keys[2]], stmt, sigs) == [1]
