package gokv

import "fmt"

// Eviction policies (docs/architecture.md §6). The cache, not the policy, enforces the sink rule: positions
// below a group's sink count are never released, so no policy can forget it.
//
// Today the policies are Full (CacheOptions.Eviction == nil: keep everything) and SinkWindow; sliding-
// window layers (LayerSpec.Window > 0) always behave like a SinkWindow of their own width. Both release
// whole pages only: a page is released once every token in it is outside the visible set of every future
// query, and the attention call passes the window and sink count, so tokens of a partially released
// region are masked exactly (the kernels see page id -1 for released pages).

// EvictionPolicy is what CacheOptions.Eviction holds: which tokens of a sequence the cache may release.
// SinkWindow is the policy today; H2O, SnapKV and Quest will be further implementations, so a caller's
// code that sets a policy keeps compiling as they arrive. Its method is unexported: policies are defined
// by this package, which enforces the sink rule itself (no policy can release a sink position).
type EvictionPolicy interface {
	// windowRule returns the positions the policy keeps visible to full-attention layers, or an error
	// naming what is wrong with the policy's settings.
	windowRule() (SinkWindow, error)
}

// SinkWindow is StreamingLLM's policy: keep the first Sinks positions (the attention sinks) and the last
// Window positions of every sequence, evict the rest. A query at position p sees positions < Sinks and
// positions in (p - Window, p]. Window must be >= 1; Sinks >= 0 (DefaultSinkTokens = 4 is the paper's).
type SinkWindow struct {
	Sinks  int
	Window int
}

func (p SinkWindow) windowRule() (SinkWindow, error) {
	if p.Window < 1 || p.Sinks < 0 {
		return p, fmt.Errorf("Eviction SinkWindow{Sinks: %d, Window: %d}: Window must be >= 1 and Sinks >= 0", p.Sinks, p.Window)
	}
	return p, nil
}

// resolveEviction returns the window rule of a policy: nil (also a nil *SinkWindow) keeps everything.
func resolveEviction(p EvictionPolicy) (*SinkWindow, error) {
	if p == nil {
		return nil, nil
	}
	if sw, ok := p.(*SinkWindow); ok && sw == nil {
		return nil, nil
	}
	sw, err := p.windowRule()
	if err != nil {
		return nil, err
	}
	return &sw, nil
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
