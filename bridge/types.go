package bridge

import "strconv"

// The types of the ABI's descriptors, flags and constants, in plain Go: they build with and without cgo
// (nocgo.go), so that package gokv's device-free parts build everywhere. The constants equal gokv.h's;
// TestConstantsMatchHeader holds them to it.

// formatNames are gokv_format_name's answers, in ABI order.
var formatNames = [...]string{"f32", "f16", "q8", "q4", "kivi2", "kivi4"}

// Format is a storage format of K and V (GOKV_FORMAT_*, docs/architecture.md §4).
type Format int32

// The storage formats.
const (
	FormatF32   Format = 0
	FormatF16   Format = 1
	FormatQ8    Format = 2 // per token, groups of g along head_dim, 8-bit
	FormatQ4    Format = 3 // per token, groups of g along head_dim, 4-bit
	FormatKIVI2 Format = 4 // keys per channel over g tokens, values per token, 2-bit; residual in f16
	FormatKIVI4 Format = 5 // as KIVI2 with 4 bits
)

// Formats lists every format, in ABI order.
var Formats = []Format{FormatF32, FormatF16, FormatQ8, FormatQ4, FormatKIVI2, FormatKIVI4}

// String returns the format's ABI name ("f32", "q4", "kivi2", ...), or "format(N)" if unknown.
func (f Format) String() string {
	if f >= 0 && int(f) < len(formatNames) {
		return formatNames[f]
	}
	return "format(" + strconv.Itoa(int(f)) + ")"
}

// Bits returns the bits per stored element of the format (32, 16, 8, 4, 2), or 0 if unknown.
func (f Format) Bits() int {
	switch f {
	case FormatF32:
		return 32
	case FormatF16:
		return 16
	case FormatQ8:
		return 8
	case FormatQ4, FormatKIVI4:
		return 4
	case FormatKIVI2:
		return 2
	}
	return 0
}

// Quantized reports whether the format stores affine-quantized groups (q8, q4, kivi2, kivi4).
func (f Format) Quantized() bool { return f >= FormatQ8 && f <= FormatKIVI4 }

// KIVI reports whether the format quantizes keys per channel with a full-precision residual.
func (f Format) KIVI() bool { return f == FormatKIVI2 || f == FormatKIVI4 }

// Caps is a set of GOKV_CAP_* capability bits.
type Caps uint32

// The device capabilities (gokv.h GOKV_CAP_*).
const (
	CapDecode       Caps = 1 << 0
	CapPrefill      Caps = 1 << 1
	CapLearnedSinks Caps = 1 << 2
	CapWindow       Caps = 1 << 3
	CapMLA          Caps = 1 << 4
	CapHoles        Caps = 1 << 5
	CapBaseline     Caps = 1 << 6 // AttendDequantBaseline is available
	CapMass         Caps = 1 << 7 // AttendBatch.Mass (attention mass output, what H2O and SnapKV rank by)
	CapKVHeadMasks  Caps = 1 << 8 // AttendMaskPerKVHead (one validity mask per kv head)
	CapQuest        Caps = 1 << 9 // PoolDesc.KeyBounds and AttendBatch.QuestPages (Quest's page selection)
)

// Has reports whether every bit of c2 is in c.
func (c Caps) Has(c2 Caps) bool { return c&c2 == c2 }

// DeviceInfo describes an open device (gokv_device_info).
type DeviceInfo struct {
	Backend      string // "cpu", "vulkan", ...
	Name         string // the device's name (CPU: the processor model)
	Features     string // CPU: the SIMD paths chosen, e.g. "avx2 fma f16c"
	MemoryBytes  uint64 // device memory (CPU: physical RAM)
	SubgroupSize int    // CPU: SIMD width in floats of the chosen path
	Threads      int    // worker threads in use
	Caps         Caps
	FormatMask   uint32 // bit (1 << format) for each supported format
}

// SupportsFormat reports whether the device can store f.
func (i DeviceInfo) SupportsFormat(f Format) bool {
	return f >= 0 && f < 32 && i.FormatMask&(1<<uint(f)) != 0
}

// PoolDesc describes a page pool: the storage of one (layer group, format, geometry) (gokv_pool_desc).
// The C core validates every field and names the one at fault.
type PoolDesc struct {
	Format        Format
	GroupSize     int  // g: 32, 64 or 128 for quantized formats (divides the head dims; KIVI: divides PageSize); else 0
	Residual      int  // KIVI R: full-precision recent tokens, a multiple of g (0 allowed); else 0
	KVHeads       int  // KV heads (MLA: 1)
	HeadDimK      int  // d_qk: 1..1024, a multiple of 4 (and of g when quantized)
	HeadDimV      int  // d_v: same rules; with VIsKPrefix, d_v <= d_qk
	VIsKPrefix    bool // MLA absorbed form: V is the first HeadDimV dims of K, no V storage
	PageSize      int  // P tokens per page: a multiple of 8 (and of g for KIVI), 8..1024; 0 = 64
	Pages         int  // capacity in pages, >= 1
	ResidualSlots int  // KIVI: per-sequence residual rings, one per live sequence; else 0
	// KeyBounds keeps, per page and kv head, the per-channel min and max of the stored keys (fp16, rounded
	// outward), beside the page: Quest's page bounds (AttendBatch.QuestPages). Needs CapQuest: a backend
	// without it refuses the pool with ErrNotSupported.
	KeyBounds bool
}

// DefaultPageSize is the page size the ABI picks when PoolDesc.PageSize is 0.
const DefaultPageSize = 64

// WriteBatch appends tokens to n sequences (gokv_write_desc): sequence i already holds StartPos[i] tokens
// and receives rows [TokIndptr[i], TokIndptr[i+1]) of K and V. Its page table is
// PageIDs[PageIndptr[i]:PageIndptr[i+1]] and must cover every position up to the new length.
//
// Shapes (n = len(TokIndptr) - 1, rows = TokIndptr[n]):
//
//	TokIndptr, PageIndptr  [n+1]
//	PageIDs                [PageIndptr[n]]
//	StartPos               [n]
//	ResidualSlot           [n] for KIVI formats, nil otherwise
//	K                      [rows, KVHeads, HeadDimK]
//	V                      [rows, KVHeads, HeadDimV]; nil when VIsKPrefix
type WriteBatch struct {
	TokIndptr    []int32
	PageIndptr   []int32
	PageIDs      []int32
	StartPos     []int32
	ResidualSlot []int32
	K            []float32
	V            []float32
}

// ReadBatch dequantizes stored tokens back to float32 (gokv_read_desc): for sequence i of length
// KVLen[i], positions StartPos[i], StartPos[i]+1, ... go to rows [TokIndptr[i], TokIndptr[i+1]) of K and V,
// as the attention kernels see them. Released pages read as zeros.
//
// Shapes (n = len(TokIndptr) - 1, rows = TokIndptr[n]):
//
//	TokIndptr, PageIndptr  [n+1]
//	PageIDs                [PageIndptr[n]]
//	KVLen, StartPos        [n]
//	ResidualSlot           [n] for KIVI formats, nil otherwise
//	K                      [rows, KVHeads, HeadDimK] (written)
//	V                      [rows, KVHeads, HeadDimV] (written), or nil to skip values
type ReadBatch struct {
	TokIndptr    []int32
	PageIndptr   []int32
	PageIDs      []int32
	KVLen        []int32
	StartPos     []int32
	ResidualSlot []int32
	K            []float32
	V            []float32
}

// CopyBatch lists whole pages and residual slots to copy, SrcPages[i] -> DstPages[i] and
// SrcSlots[i] -> DstSlots[i] (copy-on-write forks). Destinations must be distinct and must not be sources.
type CopyBatch struct {
	SrcPages, DstPages []int32
	SrcSlots, DstSlots []int32
}

// GatherBatch lists token rows to move between pages as stored (gokv_pool_gather_rows): row i moves kv
// head KVHeads[i]'s key and value rows from slot SrcSlots[i] of page SrcPages[i] to slot DstSlots[i] of
// page DstPages[i]. Destinations (page, slot, head) are distinct and no destination page is a source.
type GatherBatch struct {
	SrcPages, SrcSlots []int32
	DstPages, DstSlots []int32
	KVHeads            []int32
}

// AttendFlags are the GOKV_ATTEND_* flags.
type AttendFlags uint32

// The attention flags.
const (
	// AttendDequantBaseline uses the dequantize-then-attend baseline (benchmarks only).
	AttendDequantBaseline AttendFlags = 1 << 0
	// AttendForceScalar uses the plain scalar kernels even where a SIMD path exists.
	AttendForceScalar AttendFlags = 1 << 1
	// AttendMaskPerKVHead: ValidMask holds one mask per kv head (per-kv-head eviction: H2O, SnapKV).
	// Sequence i's words at ValidIndptr[i] are KVHeads masks of W_i = ceil(KVLen[i]/32) words each, kv
	// head h's starting at word ValidIndptr[i] + h*W_i; a query head sees token t only if its kv head's
	// bit t is set.
	AttendMaskPerKVHead AttendFlags = 1 << 2
)

// DefaultChunkSize is the split-K chunk the backends use when AttendBatch.ChunkSize is 0.
const DefaultChunkSize = 512

// AttendBatch is one batched attention call over n sequences of one pool (gokv_attend_desc,
// docs/architecture.md §5). Sequence i has KVLen[i] stored tokens and the query rows [QIndptr[i],
// QIndptr[i+1]) at positions QPos[i], QPos[i]+1, ... (decode: one row at KVLen[i]-1; prefill: T rows ending
// at KVLen[i]-1, after their K/V were written). Head h reads kv head h / (HeadsQ / KVHeads).
//
// A query at position p sees token t iff t < KVLen, t <= p, the page of t is not released (page id -1),
// bit t of its validity mask is set (when ValidMask is given), and (Window == 0 or t > p - Window or
// t < SinkTokens). A query that sees nothing outputs zeros.
//
// Shapes (n = len(QIndptr) - 1, rows = QIndptr[n], d_k/d_v the pool's head dims):
//
//	QIndptr, PageIndptr  [n+1]
//	PageIDs              [PageIndptr[n]], -1 = released page
//	KVLen, QPos          [n]
//	ResidualSlot         [n] for KIVI formats, nil otherwise
//	ValidMask            [ValidIndptr[n]] bit t%32 of word t/32 per sequence, or nil (all valid); with
//	                     AttendMaskPerKVHead, KVHeads masks of ceil(KVLen[i]/32) words per sequence
//	ValidIndptr          [n+1] word offsets into ValidMask; nil when ValidMask is nil
//	Q                    [rows, HeadsQ, d_k]
//	Out                  [rows, HeadsQ, d_v] (written)
//	SinkLogits           [HeadsQ] learned sink logits, or nil
//	Mass                 [Σ_i KVHeads*KVLen[i]] (written), or nil: the attention mass of sequence i, kv
//	                     head h and token t at off_i + h*KVLen[i] + t (off_i = Σ_{j<i} KVHeads*KVLen[j]),
//	                     the softmax probability of t summed over h's query heads and over the counted
//	                     rows (MassRows = 0: all rows of the call; R > 0: each sequence's last min(R, rows)
//	                     rows), learned sink in the denominator; 0 for tokens no counted row sees
//	QuestBounds          [PageIndptr[n], KVHeads] (written), or nil: each page-table entry's Quest bound per
//	                     kv head, -Inf for released pages and pages with no key in them yet
//	QuestSelected        [n, KVHeads, QuestPages] (written), or nil: the table indices each sequence and kv
//	                     head read by bound (ascending), -1 where fewer pages competed; the sink and recent
//	                     pages are read besides them and are not listed
//
// Quest (QuestPages = K > 0, a pool with KeyBounds, CapQuest): each sequence's single decode row reads,
// per kv head, only the K pages with the highest bound B = max over the kv head's query heads of
// Σ_c max(q_c·min_c, q_c·max_c), plus every page holding a sink token (t < SinkTokens) or one of the last
// QuestRecent tokens (and the KIVI ring); the other tokens are skipped as if masked. At most one query
// row per sequence, Window 0, not with AttendDequantBaseline.
type AttendBatch struct {
	Pool          *Pool
	QIndptr       []int32
	PageIndptr    []int32
	PageIDs       []int32
	KVLen         []int32
	QPos          []int32
	ResidualSlot  []int32
	ValidMask     []uint32
	ValidIndptr   []int32
	HeadsQ        int // a multiple of the pool's KVHeads
	Q             []float32
	Out           []float32
	Scale         float32 // α, > 0 and finite (typically 1/sqrt(d_k))
	SinkLogits    []float32
	SinkTokens    int // first positions always visible under a window (StreamingLLM)
	Window        int // sliding window W, 0 = none
	ChunkSize     int // split-K chunk in tokens, 0 = DefaultChunkSize
	Flags         AttendFlags
	Mass          []float32 // attention mass output (needs CapMass), or nil; not with AttendDequantBaseline
	MassRows      int       // query rows counted in Mass per sequence: 0 = all, R > 0 = the last min(R, rows)
	QuestPages    int       // Quest: pages read by bound per sequence and kv head (0 = off)
	QuestRecent   int       // Quest: the newest tokens whose pages are always read
	QuestBounds   []float32 // optional output with QuestPages (see above)
	QuestSelected []int32   // optional output with QuestPages (see above)
}

// LayoutSizes is what a pool of one description allocates (gokv_layout_sizes): the C core's layout,
// the one every backend allocates by, so that a planner and a cache never disagree.
type LayoutSizes struct {
	PageBytes         uint64 // one page: PageSize tokens of every kv head
	PageCodeBytes     uint64 // of which stored elements or codes
	PageMetaBytes     uint64 // of which fp16 scales and biases (the rest is alignment and tile padding)
	ResidualSlotBytes uint64 // one KIVI residual ring; 0 for the other formats
	PageBoundsBytes   uint64 // a page's key bounds, kept beside it (KeyBounds); 0 otherwise
}

// Ceilings are a device's measured limits (gokv_device_measure): the bandwidth attention's bytes are
// held to, and, where measured, the float32 FMA peak.
type Ceilings struct {
	ReadGBps   float64 // GB/s (1e9 B/s): CPU streaming read; GPU buffer copy, read + write
	PeakGFLOPs float64 // 0 where not measured (GPU decode attention is memory-bound)
	Method     string  // what was measured
}

// Fault sites of InjectFault (GOKV_FAULT_*).
const (
	FaultSubmit = 0 // the next submission of device work
	FaultAlloc  = 1 // the next device memory allocation
)

// The log levels of the native code (GOKV_LOG_*).
const (
	LogDebug = 0
	LogInfo  = 1
	LogWarn  = 2
	LogError = 3
)

// LogFunc receives one native log message: its level (LogDebug..LogError), the backend ("cpu", ...) and
// the operation ("gokv_device_open", ...) it comes from, and the text.
//
// It may be called from any goroutine or from a native worker thread, concurrently, and while a gokv call
// is in flight: it must be quick, and it must not call back into this package.
type LogFunc func(level int, backend, op, msg string)

// kiviQuantizedLenGo is gokv_kivi_quantized_len in Go (-1 for a negative n or residual or a group < 1),
// for builds without cgo; TestConstantsMatchHeader holds it to C.
func kiviQuantizedLenGo(n, group, residual int) int {
	switch {
	case n < 0 || group <= 0 || residual < 0:
		return -1
	case n <= residual:
		return 0
	}
	return (n - residual) / group * group
}
