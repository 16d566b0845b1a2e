package gokv

import (
	"fmt"
	"math"
)

// Eviction policies (docs/architecture.md §6). The cache, not the policy, enforces the sink rule: positions
// below the sink count are never released or hidden, and no policy ever sees them (or the recent window)
// as candidates, so no policy can forget it.
//
// Two kinds of policy:
//   - Window rules: Full (CacheOptions.Eviction == nil: keep everything) and SinkWindow; sliding-window
//     layers (LayerSpec.Window > 0) always behave like a SinkWindow of their own width. They release
//     whole pages only: a page is released once every token in it is outside the visible set of every
//     future query, and the attention call passes the window and sink count, so tokens of a partially
//     released region are masked exactly (the kernels see page id -1 for released pages).
//   - Token rules, deciding per (sequence, layer, kv head) from the attention mass the kernels output: H2O
//     and SnapKV. They apply to the full-attention layers (sliding layers keep their window). See
//     visibility.go for how hidden tokens become per-kv-head masks and released pages, and how that meets
//     forks and copy-on-write.
//   - Quest, a read rule: it keeps every token, and each decode step reads per kv head only the pages whose
//     key bounds promise the highest scores (plus the sink and recent pages). It applies to the
//     full-attention layers, whose pools keep key bounds.

// EvictionPolicy is what CacheOptions.Eviction holds: which tokens of a sequence the cache may release.
// The implementations are SinkWindow, H2O, SnapKV and Quest. Its method is unexported: policies are defined by
// this package, which enforces the sink rule itself (no policy can release a sink position).
type EvictionPolicy interface {
	// evictionRule returns what the policy does, or an error naming the field that is wrong with its
	// settings.
	evictionRule() (evictionRule, error)
}

// evictionRule is a resolved policy: a window rule, a token rule or a read rule (exactly one is set).
type evictionRule struct {
	window *SinkWindow
	tokens *tokenRule
	quest  *Quest
}

// Quest (Tang et al., 2024) keeps every token and makes each decode step read less of them: the pools of
// the full-attention layers keep, per page and kv head, the per-channel min and max of the stored keys,
// and a sequence's decode row reads, per kv head, only the Pages pages with the highest upper bound
// B = max over the kv head's query heads of Σ_c max(q_c·min_c, q_c·max_c) (B >= q·k for every key of the
// page), plus every page holding one of the model's sink tokens (ModelSpec.SinkTokens) or one of the
// Recent newest tokens (and, for KIVI, the residual ring). The kernels score the pages in the same call as
// the attention. Prefill rows attend in full, as in Quest: a step whose entries are not all single-token
// decodes attends in full in every entry. Sliding-window layers keep their window.
//
// Pages must be >= 1, Recent >= 0. Needs a device with DeviceCaps.Quest (NewCache fails with
// ErrNotSupported naming the layer otherwise). The key bounds cost 4·HeadsKV·HeadDimK bytes per page
// (Format.Layout's PageBoundsBytes), counted by Plan and Cache.Stats.
type Quest struct {
	Pages  int // pages read by bound per sequence, layer and kv head, besides the sink and recent pages
	Recent int // the newest tokens, whose pages are always read
}

func (p Quest) evictionRule() (evictionRule, error) {
	name := fmt.Sprintf("Eviction Quest{Pages: %d, Recent: %d}", p.Pages, p.Recent)
	switch {
	case p.Pages < 1 || p.Pages > math.MaxInt32:
		return evictionRule{}, fmt.Errorf("%s: Pages must be >= 1 (pages read by bound per kv head)", name)
	case p.Recent < 0 || p.Recent > math.MaxInt32:
		return evictionRule{}, fmt.Errorf("%s: Recent must be >= 0", name)
	}
	return evictionRule{quest: &p}, nil
}

// SinkWindow is StreamingLLM's policy: keep the first Sinks positions (the attention sinks) and the last
// Window positions of every sequence, evict the rest. A query at position p sees positions < Sinks and
// positions in (p - Window, p]. Window must be >= 1; Sinks >= 0 (DefaultSinkTokens = 4 is the paper's).
type SinkWindow struct {
	Sinks  int
	Window int
}

func (p SinkWindow) evictionRule() (evictionRule, error) {
	if p.Window < 1 || p.Sinks < 0 {
		return evictionRule{}, fmt.Errorf("Eviction SinkWindow{Sinks: %d, Window: %d}: Window must be >= 1 and Sinks >= 0", p.Sinks, p.Window)
	}
	return evictionRule{window: &p}, nil
}

// H2O is the heavy-hitter oracle (Zhang et al., 2023): every sequence keeps, per full-attention layer and
// kv head, at most Budget visible tokens: the model's sink tokens (ModelSpec.SinkTokens), the Recent
// newest tokens, and the heavy hitters, the older tokens with the largest attention mass accumulated over
// every step since they were stored (the mass the attention kernels output, summed over the kv head's
// query heads and the step's query rows, learned sink in the denominator). After each Commit, while a
// (sequence, layer, kv head) has more than Budget visible tokens, the one with the least accumulated
// mass among the candidates (neither sinks nor recent; ties: the older) is hidden from that kv head.
//
// Budget must be >= 1 and >= Recent + the model's SinkTokens (checked by NewCache); Recent >= 0. The cache
// requests the attention mass in every attend call of the layers it governs (CapMass) and passes
// per-kv-head masks (CapKVHeadMasks).
type H2O struct {
	Budget int // visible tokens per sequence, layer and kv head, sinks and recent included
	Recent int // the newest tokens, never evicted
}

func (p H2O) evictionRule() (evictionRule, error) {
	name := fmt.Sprintf("Eviction H2O{Budget: %d, Recent: %d}", p.Budget, p.Recent)
	switch {
	case p.Budget < 1:
		return evictionRule{}, fmt.Errorf("%s: Budget must be >= 1 (visible tokens per sequence, layer and kv head)", name)
	case p.Recent < 0:
		return evictionRule{}, fmt.Errorf("%s: Recent must be >= 0", name)
	case p.Recent >= p.Budget:
		return evictionRule{}, fmt.Errorf("%s: Budget must be > Recent (the budget holds the recent window, the sinks and the heavy hitters)", name)
	}
	return evictionRule{tokens: &tokenRule{kind: ruleH2O, name: name, budget: p.Budget, protect: p.Recent}}, nil
}

// SnapKV (Li et al., 2024) compresses each sequence's prompt once, at the end of its prefill: per
// full-attention layer and kv head, the attention mass of the prompt's last Window query rows (the
// observation window) over the older prompt tokens is pooled along the positions (1-D, kernel Kernel,
// stride 1, zero padding: max pooling, or average pooling with AvgPool), and the prompt keeps the model's
// sink tokens, the Window newest prompt tokens and the top prompt tokens by pooled mass, Budget tokens in
// all. Nothing is evicted afterwards: the generated tokens all stay.
//
// The prefill of a sequence is the steps that append more than one token to it before its first
// single-token step; the decision is made at that first single-token step (Cache.Begin, before it
// attends), from the mass of the last prefill step's last min(Window, rows) rows. Budget must be >= 1
// and >= Window + the model's SinkTokens (checked by NewCache); Window >= 1; Kernel 0 means 7, else odd
// and >= 1. Needs CapMass and CapKVHeadMasks.
type SnapKV struct {
	Budget  int  // prompt tokens kept per sequence, layer and kv head, sinks and window included
	Window  int  // the observation window: the prompt's last Window tokens (always kept) and query rows
	Kernel  int  // pooling kernel in positions, odd; 0 = DefaultSnapKVKernel
	AvgPool bool // average pooling instead of max pooling
}

// DefaultSnapKVKernel is SnapKV's pooling kernel when SnapKV.Kernel is 0.
const DefaultSnapKVKernel = 7

func (p SnapKV) evictionRule() (evictionRule, error) {
	name := fmt.Sprintf("Eviction SnapKV{Budget: %d, Window: %d, Kernel: %d}", p.Budget, p.Window, p.Kernel)
	k := p.Kernel
	if k == 0 {
		k = DefaultSnapKVKernel
	}
	switch {
	case p.Budget < 1:
		return evictionRule{}, fmt.Errorf("%s: Budget must be >= 1 (prompt tokens kept per sequence, layer and kv head)", name)
	case p.Window < 1:
		return evictionRule{}, fmt.Errorf("%s: Window must be >= 1 (the observation window's query rows)", name)
	case p.Window >= p.Budget:
		return evictionRule{}, fmt.Errorf("%s: Budget must be > Window (the budget holds the window, the sinks and the kept prompt tokens)", name)
	case k < 1 || k%2 == 0 || k > 1<<20:
		return evictionRule{}, fmt.Errorf("%s: Kernel must be odd and in [1, 2^20] (0 = %d)", name, DefaultSnapKVKernel)
	}
	return evictionRule{tokens: &tokenRule{kind: ruleSnapKV, name: name, budget: p.Budget, protect: p.Window, kernel: k, avg: p.AvgPool}}, nil
}

// resolveEviction resolves a policy: nil (also a nil *SinkWindow, *H2O, *SnapKV or *Quest) keeps everything.
func resolveEviction(p EvictionPolicy) (evictionRule, error) {
	switch v := p.(type) {
	case nil:
		return evictionRule{}, nil
	case *SinkWindow:
		if v == nil {
			return evictionRule{}, nil
		}
	case *H2O:
		if v == nil {
			return evictionRule{}, nil
		}
	case *SnapKV:
		if v == nil {
			return evictionRule{}, nil
		}
	case *Quest:
		if v == nil {
			return evictionRule{}, nil
		}
	}
	return p.evictionRule()
}

// groupRule is the page-table behaviour that layers sharing a group have in common: the attention window
// (0 = full attention, nothing evicted) and the sink positions that stay visible under it.
type groupRule struct {
	window int
	sinks  int
}

// layerRule derives a layer's rule from its spec and the cache's eviction policy:
//   - full-attention layer: no window (Full), or the SinkWindow's window and sinks;
//   - sliding layer of width W: window W with the model's SinkTokens as sinks (0 for layers with learned
//     sinks, which need none); a SinkWindow narrower than W narrows it, and then its Sinks are kept too.
func layerRule(spec ModelSpec, l LayerSpec, ev *SinkWindow) groupRule {
	if !l.Windowed() {
		if ev == nil {
			return groupRule{}
		}
		return groupRule{window: ev.Window, sinks: ev.Sinks}
	}
	r := groupRule{window: l.Window}
	if !l.LearnedSinks {
		r.sinks = spec.SinkTokens
	}
	if ev != nil && ev.Window < l.Window {
		r.window = ev.Window
		r.sinks = max(r.sinks, ev.Sinks)
	}
	return r
}

// evictablePages returns the page range [from, to) of a sequence of length n whose pages may be released
// under rule r: every token t of such a page has sinks <= t <= n - window, so no query at a position >= n
// sees it. quantLimit caps it for KIVI: only tokens below it (already quantized into their page) may go,
// because the residual ring still flushes into the pages of newer tokens. Empty when r has no window.
func evictablePages(r groupRule, n, quantLimit, pageSize int) (from, to int) {
	if r.window <= 0 {
		return 0, 0
	}
	last := min(n-r.window, quantLimit-1) // the last token index that may be released
	from = (r.sinks + pageSize - 1) / pageSize
	to = (last + 1) / pageSize // pages whose last token (j+1)*P-1 <= last
	if to < from {
		return from, from
	}
	return from, to
}

// boundedGroupPages is the page capacity a windowed group needs: every live sequence holds at most its
// sink pages plus the pages of its window (widened to the KIVI ring, whose pages cannot be released yet)
// plus a partly filled page, and one step adds at most maxStepTokens tokens on top. Full-attention groups
// return 0 (no bound: they are sized by MaxTokens).
func boundedGroupPages(r groupRule, ringTokens, pageSize, maxSequences, maxStepTokens int) int {
	if r.window <= 0 {
		return 0
	}
	ceil := func(a int) int { return (a + pageSize - 1) / pageSize }
	perSeq := ceil(r.sinks) + ceil(max(r.window, ringTokens)) + 1
	return maxSequences*perSeq + ceil(maxStepTokens) + 1
}
