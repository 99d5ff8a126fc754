"""docs/tutorials/images.md ("From a folder of images to predictions"), run as written: PNG folders
at three parties (no schema), `data check`, `job plan --search` on the listings, a DP-SGD job
through three real daemons from provisioned kits, `model predict` on new images, `budget show`.
Only the three ports are replaced by free ones.

Marked ``long`` (80–100 s on 2 cores): CI runs it with the long campaigns after ``make test``; the
CSV walkthrough (``test_walkthrough.py``) keeps the same path (kits, daemons, predict) in the
default suite."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.coordinator.test_walkthrough import ROOT, run_walkthrough

PAGE = ROOT / "docs" / "tutorials" / "images.md"

pytestmark = [pytest.mark.e2e, pytest.mark.long]


def test_the_images_walkthrough_goes_from_png_folders_to_predictions(tmp_path: Path) -> None:
    out, wall = run_walkthrough(PAGE, tmp_path, ("7311", "7312", "7313"))
    # each party's check states rows, shape, labels and the real preprocessing
    assert out.count("rows of 1×8×8 (64 values each, from 0 to 1), multiclass, png (no schema)") == 3, out[-4000:]
    assert "pixels / 255, reshaped to its input_shape" in out
    # the dry run read the listings, follows its runs, and searched the setting
    assert "ok: the noise leaves the signal usable: accuracy 0." in out
    assert "search at the job's ε and δ over 27 settings" in out and "← as written" in out
    band = json.loads((tmp_path / "job.plan.json").read_text())
    # the daemons' model predicts the new images far above a constant (0.13), as the dry run said;
    # one run's accuracy varies more than the dry run's 5 runs suggest (0.78 and 0.89 seen, forecast 0.87)
    acc = re.search(r"accuracy on the 359 labelled rows of digits/new/labels.csv: ([0-9.]+)", out)
    assert acc is not None, out[-3000:]
    assert float(acc.group(1)) > band["constant_predictor"] + 0.4, (acc.group(0), band)
    preds = (tmp_path / "predictions.csv").read_text().splitlines()
    assert preds[0] == "prediction,probability" and len(preds) == 359 + 1
    assert {line.split(",")[0] for line in preds[1:]} <= {str(k) for k in range(10)}
    # the budget states the next job's total, not a remainder
    assert re.search(r"digits: a further job of ε = 1 \(δ = 1e-5\) would bring the total to ε = [0-9.]+ of",
                     " ".join(out.split())), out[-2000:]
    print(f"\nimages walkthrough: held-out accuracy {float(acc.group(1)):.4f} (forecast "
          f"{band['private_mean']:.4f}); wall time {wall:.0f} s")
