"""What a member's own draws cost under sampling without replacement (mpc_erm.privacy.member_view).

A batch of b of N pooled slots drawn uniformly without replacement is hidden from every member,
but a member sees its own slots' draws: an owner whether it was drawn, a party which of its rows.
Its view of another member's slot is then the mixture, over that count, of the Gaussian on the
other slots. For each setting this prints the noise multiplier (relative to the replace-one
shift) that meets the target ε for an outside observer alone and for every view, and ε of each
view at the observer's noise.

    python -m benchmarks.member_view --out benchmarks/results/member_view.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from benchmarks.aggregate import machine_info
from mpc_erm.privacy.accountants import noise_multiplier_for
from mpc_erm.privacy.member_view import member_view_curve
from mpc_erm.privacy.subsampled import RDP_ORDERS

#: (name, N, b, rounds, δ, ε, members' slot counts)
SETTINGS = [
    ("thesis Table 4.2: a9a, b = 100, 4 passes, 3 equal parties", 32_561, 100, 4 * 32_561 // 100, 1e-5, 0.5,
     (10_854, 10_854, 10_853)),
    ("the same, one party with three quarters of the rows", 32_561, 100, 4 * 32_561 // 100, 1e-5, 0.5,
     (24_421, 4_070, 4_070)),
    ("MNIST CNN: 60,000 rows, b = 256, 10 epochs, 3 equal parties", 60_000, 256, 10 * 60_000 // 256, 1e-5, 1.2,
     (20_000, 20_000, 20_000)),
    ("DP-Fed-LS: 1,000 owners, 50 a round, 30 rounds (each owner sees its own draw)", 1_000, 50, 30, 1 / 1000**1.1,
     7.0, (1,)),
]


def run_setting(name: str, n_all: int, b: int, rounds: int, delta: float, eps: float,
                members: tuple[int, ...]) -> dict[str, object]:
    q = b / n_all
    tic = time.perf_counter()
    z_obs = noise_multiplier_for("rdp", eps, delta, rounds, q, "replace", population=n_all)
    z_all = noise_multiplier_for("rdp", eps, delta, rounds, q, "replace", population=n_all, member_rows=members)
    seconds = time.perf_counter() - tic
    views = {}
    for n in sorted({0, *members}):
        curve = member_view_curve(z_obs, n_all, b, n)
        views["observer" if n == 0 else f"member with {n} slots"] = float(
            compute_epsilon(RDP_ORDERS, rounds * curve, delta)[0])
    return {"setting": name, "population": n_all, "sample_size": b, "rounds": rounds, "delta": delta,
            "target_epsilon": eps, "member_slots": list(members),
            "noise_multiplier_observer_only": z_obs, "noise_multiplier_every_view": z_all,
            "noise_ratio": z_all / z_obs, "epsilon_of_each_view_at_the_observers_noise": views,
            "calibration_seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    tic = time.perf_counter()
    rows = [run_setting(*s) for s in SETTINGS]
    for r in rows:
        views = ", ".join(f"{k} {v:.5f}" for k, v in r["epsilon_of_each_view_at_the_observers_noise"].items())
        print(f"{r['setting']}: z {r['noise_multiplier_observer_only']:.5f} → {r['noise_multiplier_every_view']:.5f} "
              f"(×{r['noise_ratio']:.5f}); ε at the observer's z: {views}")
    out = {"benchmark": "member_view", "machine": machine_info(),
           "command": "python -m benchmarks.member_view --out benchmarks/results/member_view.json",
           "what": __doc__.split("\n\n")[1].replace("\n", " "), "rows": rows,
           "wall_seconds_this_command": time.perf_counter() - tic}
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
