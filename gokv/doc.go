// Package gokv is the public Go API of gokv: compressed KV caches and fused attention for LLM inference.
//
// A Go inference engine hands gokv the new keys, values and queries of each layer; gokv stores the keys
// and values compressed (f16, q8, q4, KIVI 2/4-bit, per layer), keeps the attention sinks, evicts what
// a policy allows, and returns attention outputs computed directly on the compressed data by a native
// backend (CPU always; Vulkan, Metal or SYCL by build tag). Go owns the control plane (page tables,
// sequences, refcounts, eviction); native code owns the data (pages, quantization, attention).
//
// Typical use:
//
//	eng, err := gokv.Open(gokv.WithBackend("cpu"))
//	defer eng.Close()
//	spec, _ := gokv.Preset("llama-3.1-8b")
//	cache, err := eng.NewCache(spec, gokv.CacheOptions{Format: gokv.MustParseFormat("q4"), MaxTokens: 1 << 16})
//	defer cache.Close()
//	seq, _ := cache.NewSequence()
//	st, err := cache.Begin(gokv.StepEntry{Seq: seq, NewTokens: len(prompt)}) // prefill
//	for l := range spec.Layers {
//		// q, k, v from the model's layer l for st.Rows() tokens
//		err = st.Layer(l, q, k, v, out)
//	}
//	err = st.Commit()
//
// Files: engine.go (Open, options, devices, native log forwarding), cache.go (NewCache, layer groups,
// pools, stats), sequence.go (sequences: fork, truncate, release), step.go (batched decode/prefill
// steps), policy.go (eviction policies: SinkWindow, H2O, SnapKV, Quest), tokenpolicy.go (H2O's and SnapKV's
// decisions per kv head), visibility.go (per-kv-head visibility: masks, page release, forks), quest.go
// (Quest's page selection in decode steps and the pages each read), errors.go
// (Error and its sentinels); format.go, model.go,
// presets.go, hfconfig.go and plan.go hold the formats, model specs and the memory planner, which need
// no device; paged.go (PagedPool) is the low-level path for engines that keep their own page tables.
//
// Built without cgo (CGO_ENABLED=0), the package still compiles: formats, model specs, presets, HF
// configs and Plan work (the page layout then comes from a Go mirror of the C core's), and Open fails
// with an ErrNoDevice whose cause is ErrNoCgo.
//
// Errors are *Error values (or *CapacityError for ErrCapacity); compare them with errors.Is against the
// sentinels (ErrInvalid, ErrOutOfMemory, ErrCapacity, ErrClosed, ...). No call panics on bad input, and a
// failed call leaves what was stored intact.
//
// The CPU backend computes on its own worker threads and on the calling goroutine's thread, inside one cgo
// call per layer step. Keep GOMAXPROCS at 2 or more: with a single P, Go's sysmon hands that P to a new,
// spinning thread during every call longer than 20 µs, which then competes with the workers for the cores
// (docs/performance.md). With two or more, sysmon does the same to a goroutine it has not seen rescheduled
// for 10 ms, which is what a decode loop of back-to-back calls looks like; the bridge therefore yields the
// calling goroutine (runtime.Gosched) at most once every 2 ms, just before a call, except after a call of
// 10 ms or more, which loses its P anyway (bridge/sched.go).
package gokv
