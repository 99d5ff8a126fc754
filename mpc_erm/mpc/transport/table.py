"""The job's party table: who the members are, where their mailboxes listen, and their ranks.

Ranks come from this table (parties in order, then the dealer if any, at rank ``world_size``
as CrypTen's ``get_ttp_rank`` expects), never from torch.distributed environment variables.
Names are the identities in the members' TLS certificates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..pki import validate_name

ROLES = ("party", "dealer")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@dataclass(frozen=True)
class Member:
    """One member of a job: its certificate name, mailbox address and role."""

    name: str
    address: str
    role: str = "party"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"member {self.name!r}: role must be one of {ROLES}, not {self.role!r}")
        validate_name(self.name, "member name")  # the name in the member's certificate


@dataclass(frozen=True)
class PartyTable:
    """Members of one MPC job. ``parties`` order defines the CrypTen ranks 0..world_size-1."""

    job_id: str
    parties: tuple[Member, ...]
    dealer: Member | None = None

    def __post_init__(self) -> None:
        if not _JOB_ID.match(self.job_id):
            raise ValueError(f"job id {self.job_id!r} must match {_JOB_ID.pattern}")
        if not self.parties:
            raise ValueError("a job needs at least one party")
        if any(m.role != "party" for m in self.parties):
            raise ValueError("every entry of parties must have role 'party'")
        if self.dealer is not None and self.dealer.role != "dealer":
            raise ValueError("the dealer entry must have role 'dealer'")
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"member names must be unique: {names}")

    @classmethod
    def from_pairs(
        cls,
        job_id: str,
        parties: Iterable[tuple[str, str]],
        dealer: tuple[str, str] | None = None,
    ) -> PartyTable:
        """Build a table from (name, address) pairs, as the job description lists them."""
        return cls(
            job_id=job_id,
            parties=tuple(Member(n, a, "party") for n, a in parties),
            dealer=None if dealer is None else Member(dealer[0], dealer[1], "dealer"),
        )

    @property
    def members(self) -> tuple[Member, ...]:
        """Parties then the dealer: index = rank."""
        return self.parties + ((self.dealer,) if self.dealer is not None else ())

    @property
    def world_size(self) -> int:
        """Number of computing parties (CrypTen's world size; the dealer is not counted)."""
        return len(self.parties)

    @property
    def dealer_rank(self) -> int | None:
        return None if self.dealer is None else len(self.parties)

    def member(self, rank: int) -> Member:
        if not 0 <= rank < len(self.members):
            raise ValueError(f"job {self.job_id}: no member with rank {rank}")
        return self.members[rank]

    def rank_of(self, name: str) -> int:
        for rank, m in enumerate(self.members):
            if m.name == name:
                return rank
        raise ValueError(f"job {self.job_id}: {name!r} is not a member")

    def describe(self, rank: int) -> str:
        """'party 1 "bob" at host:port': what error messages say about a peer."""
        m = self.member(rank)
        return f"{m.role} {rank} {m.name!r} at {m.address}"

    def ranks(self, names: Sequence[str]) -> tuple[int, ...]:
        return tuple(self.rank_of(n) for n in names)
