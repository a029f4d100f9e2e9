"""Benchmark statistics: robust summaries, adaptive sampling and A/B ratios (numpy only).

Run times are skewed (interrupts, frequency changes), so the summary centres on the
median and its uncertainty is a seeded percentile-bootstrap interval: the same samples
always give the same numbers, and a comparison between two variants reports an interval
on the ratio of medians rather than two numbers to eyeball.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stagegraph.core.ports import Schema

#: Cap on the elements of one bootstrap block (resamples x samples), to bound memory.
_BLOCK = 4_000_000
#: Widest 95% interval half-width, relative to the median (or ratio), still shown as a number.
MAX_REL_HALFWIDTH = 0.05
#: Largest p90/p10 of the samples: wider means the run had phases of very different speed
#: (threads fighting for cores, frequency changes), and a rerun may land in another phase.
#: Percentiles, not max/min: one interrupt in a thousand calls should not condemn a run.
MAX_SPREAD = 1.5
#: Fewest samples whose interval means anything: with one or two, it is zero-width or a guess.
MIN_SAMPLES = 5
#: Largest max/min of one ratio measured again in fresh processes. Each process can land in
#: another phase (where the kernel put its pages, what the VM's neighbours did), and then
#: every process's own interval is tight while the processes disagree. A median of them is
#: then one phase's number, and a rerun may give another.
MAX_REPEAT_SPREAD = 1.10


class Stats(Schema):
    """Summary of run-time samples in seconds; ``samples`` is how many there were."""

    samples: int
    median_s: float
    min_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    cv: float
    ci_low_s: float
    ci_high_s: float

    @property
    def rel_halfwidth(self) -> float:
        """Half-width of the median's confidence interval relative to the median."""
        return (self.ci_high_s - self.ci_low_s) / 2 / self.median_s if self.median_s else 0.0


class Ratio(Schema):
    """Ratio of medians ``a / b`` with a bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float


class Trust(Schema):
    """Whether a measurement is precise enough to quote, and if not, why."""

    trustworthy: bool
    warning: str = ""


def assess(
    stats: Stats, max_rel_halfwidth: float = MAX_REL_HALFWIDTH, max_spread: float = MAX_SPREAD
) -> Trust:
    """Flag samples too spread (or too few) to trust: a wide interval of the median, a wide
    p10..p90, or fewer than :data:`MIN_SAMPLES` samples.

    Two identical runs of a noisy benchmark can differ many times over; a report that prints
    such a median to four digits without a word misleads more than it informs.
    """
    problems = []
    if stats.samples < MIN_SAMPLES:
        problems.append(f"only {stats.samples} samples (at least {MIN_SAMPLES} needed)")
    if stats.rel_halfwidth > max_rel_halfwidth:
        width, bound = stats.rel_halfwidth, max_rel_halfwidth
        problems.append(f"95% interval of the median is ±{width:.0%} (bound ±{bound:.0%})")
    spread = stats.p90_s / stats.p10_s if stats.p10_s > 0 else float("inf")
    if spread > max_spread:
        problems.append(f"p90/p10 of the samples is {spread:.2f} (bound {max_spread:.2f})")
    return Trust(trustworthy=not problems, warning="; ".join(problems))


def assess_ratio(
    r: Ratio, sides: tuple[Trust, ...] = (), max_rel_halfwidth: float = MAX_REL_HALFWIDTH
) -> Trust:
    """Flag a ratio whose interval is too wide, or whose variants were not trustworthy (their
    warnings are repeated: a tight paired ratio of bimodal samples can still flip on a rerun)."""
    problems = []
    halfwidth = (r.high - r.low) / 2 / r.ratio if r.ratio else 0.0
    if halfwidth > max_rel_halfwidth:
        problems.append(
            f"95% interval of the ratio is ±{halfwidth:.0%} (bound ±{max_rel_halfwidth:.0%})"
        )
    problems += [side.warning for side in sides if not side.trustworthy]
    return Trust(trustworthy=not problems, warning="; ".join(problems))


def assess_repeats(
    values: Sequence[float], max_spread: float = MAX_REPEAT_SPREAD, what: str = "repeats"
) -> Trust:
    """Flag one quantity measured several times over (a ratio in fresh processes, say)
    whose largest and smallest values differ by more than ``max_spread`` (max/min);
    ``what`` names the repeats in the warning.

    Each repeat's own interval says nothing about this: the spread between processes
    is the uncertainty a single process cannot see."""
    if len(values) < 2:
        return Trust(trustworthy=True)
    low, high = min(values), max(values)
    spread = high / low if low > 0 else float("inf")
    if spread <= max_spread:
        return Trust(trustworthy=True)
    return Trust(
        trustworthy=False,
        warning=f"{len(values)} {what} read {low:.2f}-{high:.2f} "
        f"(max/min {spread:.2f}, bound {max_spread:.2f})",
    )


def _clean(samples: np.ndarray | list[float], name: str = "samples") -> np.ndarray:
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


def _boot_medians(
    rng: np.random.Generator, xs: list[np.ndarray], resamples: int, paired: bool = False
) -> list[np.ndarray]:
    """Medians of bootstrap resamples of each array, block-wise to bound memory.

    ``paired`` draws the same positions for every array (they must have equal lengths).
    """
    outs = [np.empty(resamples) for _ in xs]
    block = max(1, _BLOCK // max(x.size for x in xs))
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = None
        for x, out in zip(xs, outs, strict=True):
            if idx is None or not paired:
                idx = rng.integers(0, x.size, size=(stop - start, x.size))
            out[start:stop] = np.median(x[idx], axis=1)
    return outs


def bootstrap_median_ci(
    samples: np.ndarray | list[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (deterministic per seed)."""
    x = _clean(samples)
    if x.size == 1:
        return float(x[0]), float(x[0])
    (meds,) = _boot_medians(np.random.default_rng(seed), [x], resamples)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(meds, [alpha, 1 - alpha])
    return float(low), float(high)


def summarize(
    samples: np.ndarray | list[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Stats:
    """:class:`Stats` of a sample array (seconds)."""
    x = _clean(samples)
    mean = float(x.mean())
    low, high = bootstrap_median_ci(x, confidence=confidence, resamples=resamples, seed=seed)
    p10, median, p90 = np.quantile(x, [0.1, 0.5, 0.9])
    return Stats(
        samples=int(x.size),
        median_s=float(median),
        min_s=float(x.min()),
        p10_s=float(p10),
        p90_s=float(p90),
        mean_s=mean,
        cv=float(x.std(ddof=1) / mean) if x.size > 1 and mean else 0.0,
        ci_low_s=low,
        ci_high_s=high,
    )


def collect_samples(
    measure: Callable[[int], np.ndarray],
    *,
    rel_halfwidth: float = 0.02,
    budget_s: float = 10.0,
    min_samples: int = 10,
    max_samples: int | None = None,
    min_time_s: float = 0.0,
    seed: int = 0,
) -> tuple[np.ndarray, bool]:
    """Call ``measure(k)`` (returns ``k`` durations in seconds) until the median is known:
    the one sampling loop of every benchmark (bench, the MPI ranks, the tuner's callers).

    Stops when the bootstrap CI of the median lies within ``±rel_halfwidth`` of it (and at
    least ``min_time_s`` was spent), when ``budget_s`` of wall time has been spent, or at
    ``max_samples``. Each batch is sized to at most double the samples so far and to fit in
    the remaining budget, estimated from the wall time per sample of the previous batches.
    Returns the samples and whether the precision target was met.
    """
    if min_samples < 2:
        raise ValueError("min_samples must be at least 2 for a confidence interval")
    cap = max_samples if max_samples is not None else float("inf")
    begin = time.perf_counter()
    chunks: list[np.ndarray] = []
    count = 0
    want = int(min(min_samples, cap))
    while True:
        batch = _clean(measure(want), "measure() result")
        chunks.append(batch)
        count += batch.size
        samples = np.concatenate(chunks)
        spent = time.perf_counter() - begin
        converged = summarize(samples, seed=seed).rel_halfwidth <= rel_halfwidth
        if (converged and spent >= min_time_s) or spent >= budget_s or count >= cap:
            return samples, converged
        per_sample = spent / count
        affordable = int((budget_s - spent) / per_sample) if per_sample > 0 else count
        want = int(max(1, min(count, affordable, cap - count)))


def interleaved_samples(
    measures: Sequence[Callable[[int], np.ndarray]],
    batch: int,
    done: Callable[[list[np.ndarray], float], bool],
) -> list[np.ndarray]:
    """Call each of ``measures`` with ``batch`` in turn, round after round, until
    ``done(samples, seconds spent)``: the one loop that times several variants side by
    side, so that machine noise (another process, a frequency change) hits them alike
    (``bench --vs``, the tuner's candidate against its baseline). Returns each variant's
    samples, in the order of ``measures``."""
    chunks: list[list[np.ndarray]] = [[] for _ in measures]
    begin = time.perf_counter()
    while True:
        for measure, kept in zip(measures, chunks, strict=True):
            kept.append(np.asarray(measure(batch), dtype=np.float64).ravel())
        samples = [np.concatenate(kept) for kept in chunks]
        if done(samples, time.perf_counter() - begin):
            return samples


def sample_until(measure: Callable[[int], np.ndarray], **options: Any) -> Stats:
    """:func:`collect_samples`, summarized (check ``stats.rel_halfwidth`` to see whether the
    target was met)."""
    samples, _ = collect_samples(measure, **options)
    return summarize(samples, seed=options.get("seed", 0))


def ratio(
    samples_a: np.ndarray | list[float],
    samples_b: np.ndarray | list[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    paired: bool = False,
) -> Ratio:
    """Ratio of medians ``median(a) / median(b)`` with a bootstrap interval.

    For interleaved A/B runs of equal length, ``paired=True`` resamples the same positions
    in both, so slow phases of the machine that hit both variants cancel out.
    """
    a, b = _clean(samples_a, "samples_a"), _clean(samples_b, "samples_b")
    if paired and a.size != b.size:
        raise ValueError(f"paired samples need equal lengths, got {a.size} and {b.size}")
    ma, mb = _boot_medians(np.random.default_rng(seed), [a, b], resamples, paired)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(ma / mb, [alpha, 1 - alpha])
    value = float(np.median(a) / np.median(b))
    return Ratio(ratio=value, low=float(low), high=float(high), confidence=confidence)


def gflops(flops: float, seconds: float) -> float:
    """Throughput in GFLOP/s for ``flops`` floating-point operations taking ``seconds``."""
    return flops / seconds / 1e9


def gbps(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second) for ``nbytes`` moved in ``seconds``."""
    return nbytes / seconds / 1e9
