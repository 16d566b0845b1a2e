package gokv

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Token rules (H2O, SnapKV): the pure decision logic, independent of pools and kernels. The cache holds
// the state of each (sequence, layer, kv head) in a headState and calls decide with the scores the rule
// ranks by; decide computes the candidates itself, so that a rule only ever ranks tokens that are
// neither sinks nor in its protected recent window.

// The token rules.
const (
	ruleH2O = iota + 1
	ruleSnapKV
)

// tokenRule is a resolved H2O or SnapKV policy.
type tokenRule struct {
	kind    int
	name    string // the policy as written, for errors
	budget  int    // visible tokens per (sequence, layer, kv head) after a decision
	protect int    // H2O: Recent; SnapKV: Window (the newest tokens, never candidates)
	kernel  int    // SnapKV pooling kernel (odd)
	avg     bool   // SnapKV average pooling
}

// check validates the rule against the model's sink count (the cache enforces the sinks, so the budget
// must hold them and the protected window).
func (r *tokenRule) check(sinks int) error {
	if r.budget < r.protect+sinks {
		field := "Recent"
		if r.kind == ruleSnapKV {
			field = "Window"
		}
		return fmt.Errorf("%s: Budget %d must be >= %s %d + the model's %d sink tokens (ModelSpec.SinkTokens)",
			r.name, r.budget, field, r.protect, sinks)
	}
	return nil
}

// massRows is the MassRows an attend call asks for on behalf of the rule (0 = every row).
func (r *tokenRule) massRows() int {
	if r.kind == ruleSnapKV {
		return r.protect
	}
	return 0
}

// headState is what the cache holds for one (sequence, layer, kv head) under a token rule.
type headState struct {
	hidden  tokenBits // tokens hidden from this kv head
	nHidden int
	// score: H2O: the attention mass each token accumulated since it was stored; SnapKV: the mass of the
	// last prefill step's observation window, until the decision (then nil).
	score []float32
}

// clone returns a deep copy (Fork: the child starts from the parent's visibility and scores).
func (h headState) clone() headState {
	return headState{hidden: slices.Clone(h.hidden), nHidden: h.nHidden, score: slices.Clone(h.score)}
}

// truncate forgets everything about tokens >= n.
func (h *headState) truncate(n int) {
	h.nHidden -= h.hidden.clearFrom(n)
	if len(h.score) > n {
		h.score = h.score[:n]
	}
}

// visible returns how many of the first n tokens the kv head still sees.
func (h *headState) visible(n int) int { return n - h.nHidden }

// decide applies rule r to one (sequence, layer, kv head) of n tokens with `sinks` sink tokens: scores[t]
// is what the rule ranks token t by (len >= the candidates' end). The candidates are the visible tokens
// in [sinks, n - protect): the sinks and the protected newest tokens are never offered to the rule. While
// more than r.budget tokens are visible, the candidate the rule ranks lowest is hidden. It returns the
// positions it hid, in increasing order.
func (r *tokenRule) decide(h *headState, n, sinks int, scores []float32) []int {
	lo, hi := min(max(sinks, 0), n), max(n-r.protect, 0)
	excess := h.visible(n) - r.budget
	if excess <= 0 || hi <= lo {
		return nil
	}
	var cand []int
	for t := lo; t < hi; t++ {
		if !h.hidden.has(t) {
			cand = append(cand, t)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	x := make([]float32, len(cand))
	for i, t := range cand {
		if t < len(scores) {
			x[i] = scores[t]
		}
	}
	drop := r.choose(x, min(excess, len(cand)))
	out := make([]int, 0, len(drop))
	for _, i := range drop {
		// The cache, not the rule, guards the sink rule: only candidates can be hidden.
		if i < 0 || i >= len(cand) {
			continue
		}
		t := cand[i]
		if t < lo || t >= hi || h.hidden.has(t) {
			continue
		}
		h.hidden.set(t)
		h.nHidden++
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// choose is the rule proper: given the candidates' scores (in position order), the indices of the k it
// drops. H2O drops the k smallest accumulated masses; SnapKV pools the scores along the positions first.
// Ties drop the older candidate; NaN ranks lowest.
func (r *tokenRule) choose(x []float32, k int) []int {
	if r.kind == ruleSnapKV {
		x = pool1D(x, r.kernel, r.avg)
	}
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	key := func(v float32) float64 {
		if math.IsNaN(float64(v)) {
			return math.Inf(-1)
		}
		return float64(v)
	}
	if k == 1 { // a decode step's usual case: one scan, not a sort
		best := 0
		for i := 1; i < len(x); i++ {
			if key(x[i]) < key(x[best]) {
				best = i
			}
		}
		return []int{best}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(key(x[a]), key(x[b])) })
	return idx[:k]
}

// pool1D is a 1-D pooling of x with an odd kernel k, stride 1 and k/2 positions of padding at each end:
// max pooling (padding ignored), or average pooling over k positions with zero padding (PyTorch's
// avg_pool1d with count_include_pad).
func pool1D(x []float32, k int, avg bool) []float32 {
	if k <= 1 {
		return slices.Clone(x)
	}
	pad := k / 2
	out := make([]float32, len(x))
	for i := range x {
		lo, hi := max(i-pad, 0), min(i+pad+1, len(x))
		if avg {
			s := 0.0
			for _, v := range x[lo:hi] {
				s += float64(v)
			}
			out[i] = float32(s / float64(k))
			continue
		}
		m := float32(math.Inf(-1))
		for _, v := range x[lo:hi] {
			if v > m || math.IsNaN(float64(m)) {
				m = v
			}
		}
		out[i] = m
	}
	return out
}

// tokenBits is a set of token positions, bit t%32 of word t/32 (the ABI's mask layout, inverted: a set
// bit is a hidden token). Words past its length are all clear.
type tokenBits []uint32

func (b tokenBits) has(t int) bool {
	w := t >> 5
	return t >= 0 && w < len(b) && b[w]>>(uint(t)&31)&1 != 0
}

func (b *tokenBits) set(t int) {
	for len(*b) <= t>>5 {
		*b = append(*b, 0)
	}
	(*b)[t>>5] |= 1 << (uint(t) & 31)
}

// all reports whether every position in [lo, hi) is set.
func (b tokenBits) all(lo, hi int) bool {
	for t := lo; t < hi; {
		if t&31 == 0 && t+32 <= hi {
			if t>>5 >= len(b) || b[t>>5] != ^uint32(0) {
				return false
			}
			t += 32
			continue
		}
		if !b.has(t) {
			return false
		}
		t++
	}
	return true
}

// clearFrom clears every position >= n and returns how many were set.
func (b *tokenBits) clearFrom(n int) int {
	cleared := 0
	for t := n; t < len(*b)*32; t++ {
		if b.has(t) {
			(*b)[t>>5] &^= 1 << (uint(t) & 31)
			cleared++
		}
	}
	*b = (*b)[:min(len(*b), (n+31)/32)]
	return cleared
}

// maskWords writes the validity mask (set = visible) of the first 32·len(dst) positions into dst.
func (b tokenBits) maskWords(dst []uint32) {
	for w := range dst {
		v := ^uint32(0)
		if w < len(b) {
			v = ^b[w]
		}
		dst[w] = v
	}
}
