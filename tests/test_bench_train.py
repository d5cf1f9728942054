"""bench/train.py's part 4: float32 against bfloat16 on one step, on a tiny model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_train", ROOT / "bench/train.py")
bench_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_train)


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    yield


def test_the_compute_dtype_part_times_both_and_measures_how_far_pi_lag_moved(tiny_base):
    result = bench_train.compute_dtypes(tiny_base, None, 2, reps=1)
    exact, fast = result["best"]["float32"], result["best"]["bfloat16"]
    assert exact["s"] > 0 and fast["s"] > 0 and exact["tokens"] == fast["tokens"] > 700
    assert abs(exact["loss"] - fast["loss"]) < 0.05 * abs(exact["loss"])
    # The two pi_lag differ (bfloat16 did round), by far less than a nat a token.
    assert 0 < result["token_mean"] <= result["token_p99"] <= result["token_max"] < 0.1
