"""Benchmark statistics: summaries, bootstrap intervals, adaptive sampling, ratios."""

from __future__ import annotations

import numpy as np
import pytest

from stagegraph.runtime.stats import (
    Ratio,
    Stats,
    bootstrap_median_ci,
    gbps,
    gflops,
    ratio,
    sample_until,
    summarize,
)


def test_summarize_values():
    x = np.arange(1, 12, dtype=float)  # 1..11
    s = summarize(x)
    assert s.samples == 11
    assert (s.median_s, s.min_s, s.mean_s) == (6.0, 1.0, 6.0)
    assert s.p10_s == pytest.approx(2.0) and s.p90_s == pytest.approx(10.0)
    assert s.cv == pytest.approx(x.std(ddof=1) / 6.0)
    assert s.ci_low_s <= 6.0 <= s.ci_high_s
    assert s.ci_low_s >= 3.0 and s.ci_high_s <= 9.0


def test_summarize_is_seeded_and_serializable():
    x = np.random.default_rng(3).lognormal(-7, 0.2, size=50)
    assert summarize(x) == summarize(x)
    assert summarize(x, seed=1) != summarize(x, seed=2)
    s = summarize(x)
    assert Stats.model_validate_json(s.model_dump_json()) == s
    with pytest.raises(ValueError, match="frozen"):
        s.median_s = 1.0  # type: ignore[misc]


def test_summarize_edge_cases():
    one = summarize([0.5])
    assert (one.median_s, one.ci_low_s, one.ci_high_s, one.cv) == (0.5, 0.5, 0.5, 0.0)
    assert one.rel_halfwidth == 0.0
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="NaN"):
        summarize([1.0, float("nan")])


def test_bootstrap_interval_narrows_with_samples():
    rng = np.random.default_rng(0)
    small = rng.normal(1.0, 0.1, size=20)
    large = rng.normal(1.0, 0.1, size=2000)
    lo_s, hi_s = bootstrap_median_ci(small)
    lo_l, hi_l = bootstrap_median_ci(large)
    assert hi_l - lo_l < (hi_s - lo_s) / 4
    assert lo_l < 1.0 < hi_l


def noisy(rel_sigma: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    calls: list[int] = []

    def measure(k: int) -> np.ndarray:
        calls.append(k)
        return 1e-3 * (1 + rel_sigma * rng.standard_normal(k))

    return measure, calls


def test_sample_until_stops_when_precise():
    measure, calls = noisy(0.01)
    s = sample_until(measure, rel_halfwidth=0.02, budget_s=5.0, min_samples=10)
    assert calls == [10]
    assert s.samples == 10 and s.rel_halfwidth <= 0.02
    assert s.median_s == pytest.approx(1e-3, rel=0.02)


def test_sample_until_grows_batches_until_precise():
    measure, calls = noisy(0.2)
    s = sample_until(measure, rel_halfwidth=0.02, budget_s=5.0, min_samples=10)
    assert calls[0] == 10 and len(calls) > 1
    assert all(k <= sum(calls[:i]) for i, k in enumerate(calls) if i)  # at most doubling
    assert s.rel_halfwidth <= 0.02 and s.samples == sum(calls)


def test_sample_until_respects_budget_and_cap():
    measure, calls = noisy(5.0)
    s = sample_until(measure, rel_halfwidth=1e-6, budget_s=0.2, min_samples=10)
    assert s.rel_halfwidth > 1e-6
    measure, calls = noisy(5.0)
    s = sample_until(measure, rel_halfwidth=1e-6, budget_s=60, min_samples=10, max_samples=80)
    assert s.samples == 80 and sum(calls) == 80
    with pytest.raises(ValueError, match="min_samples"):
        sample_until(measure, min_samples=1)


def test_ratio_of_medians():
    rng = np.random.default_rng(5)
    a = 2e-3 * (1 + 0.05 * rng.standard_normal(200))
    b = 1e-3 * (1 + 0.05 * rng.standard_normal(200))
    r = ratio(a, b)
    assert isinstance(r, Ratio) and r.confidence == 0.95
    assert r.ratio == pytest.approx(2.0, rel=0.02)
    assert r.low < 2.0 < r.high and r.high - r.low < 0.1
    assert ratio(a, b) == r


def test_paired_ratio_cancels_common_drift():
    rng = np.random.default_rng(7)
    drift = np.exp(rng.normal(0, 0.3, size=100))  # machine-wide slow and fast phases
    a = 1.5e-3 * drift * (1 + 0.01 * rng.standard_normal(100))
    b = 1.0e-3 * drift * (1 + 0.01 * rng.standard_normal(100))
    unpaired, paired = ratio(a, b), ratio(a, b, paired=True)
    assert paired.low < 1.5 < paired.high
    assert paired.high - paired.low < (unpaired.high - unpaired.low) / 2
    with pytest.raises(ValueError, match="equal lengths"):
        ratio(a, b[:50], paired=True)


def test_throughput_helpers():
    assert gflops(2 * 1024**3, 0.5) == pytest.approx(2 * 1024**3 / 0.5 / 1e9)
    assert gbps(3e9, 1.5) == pytest.approx(2.0)


# -- trust: samples too spread to quote ---------------------------------------------------


def test_tight_samples_are_trustworthy():
    from stagegraph.runtime.stats import assess

    rng = np.random.default_rng(1)
    trust = assess(summarize(1e-3 * (1 + 0.01 * rng.random(200))))
    assert trust.trustworthy and trust.warning == ""


def test_bimodal_samples_are_flagged_by_spread():
    from stagegraph.runtime.stats import assess

    trust = assess(summarize(np.resize([1e-3, 24e-3], 400)))  # two phases, 24x apart
    assert not trust.trustworthy and "p90/p10" in trust.warning


def test_wide_interval_is_flagged_even_with_moderate_spread():
    from stagegraph.runtime.stats import assess

    samples = np.linspace(1e-3, 1.4e-3, 6)  # p90/p10 < 1.5, but 6 samples pin nothing down
    stats = summarize(samples)
    assert stats.p90_s / stats.p10_s < 1.5 and stats.rel_halfwidth > 0.05
    trust = assess(stats)
    assert not trust.trustworthy and "interval of the median" in trust.warning


def test_one_outlier_in_many_samples_is_not_condemned():
    from stagegraph.runtime.stats import assess

    samples = np.full(1000, 1e-3)
    samples[500] = 50e-3  # one interrupt
    assert assess(summarize(samples)).trustworthy


def test_ratio_is_flagged_when_wide_or_a_side_is_untrustworthy():
    from stagegraph.runtime.stats import Ratio, Trust, assess_ratio

    tight = Ratio(ratio=0.8, low=0.79, high=0.81, confidence=0.95)
    wide = Ratio(ratio=0.8, low=0.5, high=1.6, confidence=0.95)
    good, bad = Trust(trustworthy=True), Trust(trustworthy=False, warning="spread")
    assert assess_ratio(tight, (good, good)).trustworthy
    assert not assess_ratio(wide, (good, good)).trustworthy
    flagged = assess_ratio(tight, (good, bad))
    assert not flagged.trustworthy and flagged.warning == "spread"


def test_too_few_samples_are_flagged_even_when_identical():
    from stagegraph.runtime.stats import assess

    trust = assess(summarize([1e-3, 1e-3]))  # a zero-width interval from two samples
    assert not trust.trustworthy and "only 2 samples" in trust.warning


def test_repeats_that_disagree_beyond_the_bound_are_not_trusted():
    from stagegraph.runtime.stats import MAX_REPEAT_SPREAD, assess_repeats

    assert assess_repeats([1.0]).trustworthy  # one repeat: nothing to compare
    assert assess_repeats([0.96, 1.0, 1.04]).trustworthy  # max/min 1.083
    assert MAX_REPEAT_SPREAD == 1.10
    wide = assess_repeats([0.90, 1.08, 1.0], what="processes")
    assert not wide.trustworthy
    assert wide.warning == "3 processes read 0.90-1.08 (max/min 1.20, bound 1.10)"
    assert not assess_repeats([0.0, 1.0]).trustworthy  # a zero ratio is no agreement


def test_interleaved_samples_alternate_the_variants_until_done():
    from stagegraph.runtime.stats import interleaved_samples

    calls: list[tuple[str, int]] = []

    def variant(name: str, value: float):
        def measure(count: int) -> np.ndarray:
            calls.append((name, count))
            return np.full(count, value)

        return measure

    a, b = interleaved_samples(
        (variant("a", 1.0), variant("b", 2.0)), 3, lambda samples, _spent: samples[0].size >= 9
    )
    assert calls == [("a", 3), ("b", 3)] * 3  # one batch of each per round, a first
    assert a.tolist() == [1.0] * 9 and b.tolist() == [2.0] * 9


def test_interleaved_samples_pass_the_time_spent_to_the_stop_rule():
    from stagegraph.runtime.stats import interleaved_samples

    seen: list[float] = []

    def done(samples: list[np.ndarray], spent: float) -> bool:
        seen.append(spent)
        return len(seen) == 2

    interleaved_samples((lambda n: np.ones(n),), 1, done)
    assert len(seen) == 2 and 0 <= seen[0] <= seen[1]
