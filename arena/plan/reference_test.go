package plan_test

import (
	"github.com/vmmalloc/vmmalloc/arena/plan"
)

// This file holds slow, obvious reference models that the tests check the
// package against.

// live reports whether two lifetimes overlap ([Birth, Death) half-open).
func live(a, b plan.Interval) bool { return a.Birth < b.Death && b.Birth < a.Death }

func roundUp(n, align uint64) uint64 { return (n + align - 1) / align * align }

// bruteVerify checks every pair: the model Verify's sweep must agree with.
// It reports whether the packing is valid (ignoring the region size).
func bruteVerify(ivs []plan.Interval, offs []uint64) (i, j int, ok bool) {
	for i := range ivs {
		for j := i + 1; j < len(ivs); j++ {
			if live(ivs[i], ivs[j]) && offs[i] < offs[j]+ivs[j].Size && offs[j] < offs[i]+ivs[i].Size {
				return i, j, false
			}
		}
	}
	return 0, 0, true
}

// brutePeak is PeakLive by summing the live sizes at every birth.
func brutePeak(ivs []plan.Interval, align uint64) uint64 {
	var peak uint64
	for _, at := range ivs {
		var sum uint64
		for _, iv := range ivs {
			if iv.Birth <= at.Birth && at.Birth < iv.Death {
				sum += roundUp(iv.Size, align)
			}
		}
		peak = max(peak, sum)
	}
	return peak
}

// lowestFit places ivs[i] at the lowest offset, a multiple of align, where
// it overlaps none of the placed intervals (placed[j] true) live with it:
// the candidates are 0 and the ends of those intervals.
func lowestFit(ivs []plan.Interval, offs []uint64, placed []bool, i int, align uint64) uint64 {
	s := roundUp(ivs[i].Size, align)
	fits := func(o uint64) bool {
		for j := range ivs {
			if placed[j] && live(ivs[i], ivs[j]) && o < offs[j]+roundUp(ivs[j].Size, align) && offs[j] < o+s {
				return false
			}
		}
		return true
	}
	best := uint64(0)
	found := false
	if fits(0) {
		return 0
	}
	for j := range ivs {
		if placed[j] && live(ivs[i], ivs[j]) {
			o := offs[j] + roundUp(ivs[j].Size, align)
			if (!found || o < best) && fits(o) {
				best, found = o, true
			}
		}
	}
	return best
}

// firstFitInOrder packs ivs in order, each at its lowest fit.
func firstFitInOrder(ivs []plan.Interval, order []int, align uint64) ([]uint64, uint64) {
	offs := make([]uint64, len(ivs))
	placed := make([]bool, len(ivs))
	var size uint64
	for _, i := range order {
		offs[i] = lowestFit(ivs, offs, placed, i, align)
		placed[i] = true
		size = max(size, offs[i]+roundUp(ivs[i].Size, align))
	}
	return offs, size
}

// optimalSize is the smallest region any packing of ivs fits in. Every
// packing can be compacted, taking its intervals by increasing offset and
// moving each down to its lowest fit, into one no larger (an interval
// below another it overlaps in time only moves down), so some order of
// lowest-fit placements is optimal: this searches them all, depth first,
// pruning a partial packing as soon as it is no smaller than the best
// found and stopping at PeakLive. For n <= 8 or so.
func optimalSize(ivs []plan.Interval, align uint64) uint64 {
	n := len(ivs)
	lower := brutePeak(ivs, align)
	offs := make([]uint64, n)
	placed := make([]bool, n)
	best := ^uint64(0)
	var dfs func(depth int, size uint64)
	dfs = func(depth int, size uint64) {
		if size >= best || best == lower {
			return
		}
		if depth == n {
			best = size
			return
		}
		for i := range ivs {
			if placed[i] {
				continue
			}
			offs[i] = lowestFit(ivs, offs, placed, i, align)
			placed[i] = true
			dfs(depth+1, max(size, offs[i]+roundUp(ivs[i].Size, align)))
			placed[i] = false
		}
	}
	dfs(0, 0)
	return best
}
