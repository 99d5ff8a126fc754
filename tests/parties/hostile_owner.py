"""A data owner that deviates in what it sends (tests only): the real ``mpc-erm owner join`` in
this process, its real client and certificate, with one change at the send.

    python -m tests.parties.hostile_owner MODE owner join --config … --job … --job-id …

MODE (each from the first round on, unless said):

- ``scale``: its weighted contribution × 10⁶ (what an app install with a bug in its clipping sends);
- ``nan``: every coordinate the ring value of a float64 NaN's bit pattern (0x7ff8…);
- ``replay``: from round 2 on, its explicit share of round 1 again (a share of the wrong round);
- ``foreign``: shares made under other keys than the ones it enrolled with (a share of another job,
  or one made for another owner's slot: the compute parties' derived shares no longer cancel it).
"""

from __future__ import annotations

import sys

import torch

from parties.owner import intake, shares

NAN_BITS = 0x7FF8000000000000


def _patch(mode: str) -> None:
    contribute, split = intake.OwnerClient.contribute, shares.OwnerSharer.split
    if mode == "scale":
        def scaled(self: intake.OwnerClient, t: int, v: torch.Tensor, *a: object, **k: object) -> None:
            contribute(self, t, v * 1e6, *a, **k)  # type: ignore[arg-type]
        intake.OwnerClient.contribute = scaled  # type: ignore[method-assign]
        return
    first: dict[int, torch.Tensor] = {}

    def deviating(self: shares.OwnerSharer, ring: torch.Tensor, round_: int) -> torch.Tensor:
        if mode == "nan":
            return split(self, torch.full_like(ring, NAN_BITS), round_)
        if mode == "replay":
            honest = split(self, ring, round_)
            return first.setdefault(id(self), honest)
        if mode == "foreign":
            other = shares.OwnerSharer.new(self.owner_index, self.compute_parties)
            return split(other, ring, round_)
        raise SystemExit(f"unknown mode {mode!r}")
    shares.OwnerSharer.split = deviating  # type: ignore[method-assign]


def main() -> None:
    mode, rest = sys.argv[1], sys.argv[2:]
    _patch(mode)
    from coordinator.cli import main as cli

    sys.argv = ["mpc-erm", *rest]
    cli()


if __name__ == "__main__":
    main()
