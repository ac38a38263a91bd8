package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, which must be in ascending order: the smallest sample that at
// least p percent of the samples are less than or equal to. It returns 0 for
// no samples; p ≤ 0 gives the minimum and p ≥ 100 the maximum.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case p <= 0 || math.IsNaN(p):
		return sorted[0]
	case p >= 100:
		return sorted[n-1]
	}
	// 1-based; the epsilon keeps 99.9% of 1000 at 999 despite rounding.
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summarize turns latency samples taken over elapsed into a Latency. It does
// not modify samples.
func Summarize(samples []time.Duration, elapsed time.Duration) Latency {
	s := slices.Clone(samples)
	slices.Sort(s)
	l := Latency{N: len(s), P50: Percentile(s, 50), P99: Percentile(s, 99)}
	if len(s) > 0 {
		l.Quantiles = make([]time.Duration, 101)
		for p := range l.Quantiles {
			l.Quantiles[p] = Percentile(s, float64(p))
		}
	}
	if len(s) > 0 {
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		l.Mean = sum / time.Duration(len(s))
		l.Max = s[len(s)-1]
	}
	if elapsed > 0 {
		l.OpsPerSec = float64(len(s)) / elapsed.Seconds()
	}
	return l
}

// Spread fills the per-worker fields of t from counts: the total, min, max
// and fairness (min/max; 1 when every worker did the same, 0 when one did
// nothing or none did anything).
func Spread(t *Throughput, counts []int64) {
	t.Workers = len(counts)
	t.PerWorker = slices.Clone(counts)
	t.Ops, t.Min, t.Max, t.Fairness = 0, 0, 0, 0
	if len(counts) == 0 {
		return
	}
	t.Min, t.Max = counts[0], counts[0]
	for _, c := range counts {
		t.Ops += c
		t.Min = min(t.Min, c)
		t.Max = max(t.Max, c)
	}
	if t.Max > 0 {
		t.Fairness = float64(t.Min) / float64(t.Max)
	}
	if t.Elapsed > 0 {
		t.OpsPerSec = float64(t.Ops) / t.Elapsed.Seconds()
	}
}

// ratio is a/b, or 0 when either is not positive.
func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// span returns the lowest and highest of vs, or 0, 0 for none.
func span(vs []float64) (lo, hi float64) {
	for i, v := range vs {
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

// NoisyAbove is the spread over the rounds, (max − min) / median, above
// which a figure is flagged as noisy: its rounds disagree too much for the
// figure to be compared with another.
const NoisyAbove = 0.3

// Noise is the spread of vs: (max − min) over the median, 0 for fewer than
// two values or a median that is not positive.
func Noise(vs []float64) float64 {
	if len(vs) < 2 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	if med <= 0 {
		return 0
	}
	return (s[len(s)-1] - s[0]) / med
}

// SplitRounds cuts the samples of a latency scenario into rounds: marks[i]
// is the number of samples taken by the end of turn i, and elapsed[i] (when
// as long as marks) the time turn i spent measuring. The turns are shared
// out over the rounds in order, as evenly as they go; fewer turns than
// rounds give one round per turn.
func SplitRounds(samples []time.Duration, marks []int, elapsed []time.Duration, rounds int) []RoundLatency {
	turns := len(marks)
	if turns == 0 || rounds <= 0 {
		return nil
	}
	rounds = min(rounds, turns)
	out := make([]RoundLatency, rounds)
	from := 0
	for g := range rounds {
		last := (g+1)*turns/rounds - 1 // the last turn of round g
		first := g * turns / rounds
		to := min(marks[last], len(samples))
		part := slices.Clone(samples[from:to])
		slices.Sort(part)
		out[g] = RoundLatency{N: len(part), P50: Percentile(part, 50), P99: Percentile(part, 99)}
		if len(elapsed) == turns {
			var d time.Duration
			for _, e := range elapsed[first : last+1] {
				d += e
			}
			if d > 0 {
				out[g].OpsPerSec = float64(len(part)) / d.Seconds()
			}
		}
		from = to
	}
	return out
}
