package gokv

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/gokv/gokv/bridge"
)

// Engine is an open gokv device: one backend instance (CPU, Vulkan, Metal or SYCL) with its worker threads
// and memory, on which caches are created. Open one per process and device, and Close it when done.
//
// Thread-safety: every method may be called from many goroutines at once. Close closes the engine's
// caches (waiting for their native calls in flight), then the device.
type Engine struct {
	mu     sync.Mutex // guards caches and closed
	dev    *bridge.Device
	cfg    engineConfig
	info   bridge.DeviceInfo
	caches map[*Cache]struct{}
	closed bool

	logBackend atomic.Pointer[string] // the backend whose native messages go to the logger; nil: any
}

// engineConfig holds what the Options set.
type engineConfig struct {
	backend string
	device  int
	threads int
	logger  zerolog.Logger
	hasLog  bool
}

// Option configures Open.
type Option func(*engineConfig)

// WithBackend picks the backend: "auto" (the default: a vendor module if one is compiled in, else the
// CPU), "cpu", "vulkan", "metal" or "sycl". Backends lists those compiled into this build.
func WithBackend(name string) Option { return func(c *engineConfig) { c.backend = name } }

// WithDevice picks the device index within the backend; -1 (the default) lets the backend choose
// (discrete GPU first).
func WithDevice(index int) Option { return func(c *engineConfig) { c.device = index } }

// WithThreads sets the CPU worker threads (GPU backends use them for host work); 0, the default, uses
// every online CPU.
func WithThreads(n int) Option { return func(c *engineConfig) { c.threads = n } }

// WithLogger sends the engine's log, and the native code's log messages (with fields backend and op), to
// l. The default is silent (zerolog.Nop()). Native messages below l's level are dropped in C.
//
// The native log callback is process-wide: while several engines with loggers are open, each native
// message goes to the loggers of the engines whose backend produced it (or to all of them when the
// message names no backend).
func WithLogger(l zerolog.Logger) Option {
	return func(c *engineConfig) {
		c.logger = l
		c.hasLog = l.GetLevel() != zerolog.Disabled
	}
}

// Backends returns the backends compiled into this build, "cpu" first (none in a build without cgo).
func Backends() []string { return bridge.Backends() }

// ABIVersion returns the C ABI version of the linked native library (0 in a build without cgo).
func ABIVersion() int { return int(bridge.ABIVersion()) }

// Ceilings are a device's measured limits, the roofline an attention call is held to: the bandwidth its
// bytes are read at and, where measured, the float32 FMA peak.
type Ceilings struct {
	ReadGBps   float64 // GB/s (1e9 B/s): CPU streaming read; GPU buffer copy, read + write
	PeakGFLOPs float64 // GFLOP/s; 0 where not measured (GPU decode attention is memory-bound)
	Method     string  // what was measured, in words
}

// Measure measures the device's ceilings over about bytes of memory (0: the backend's default; a few
// times the last-level cache is right for a CPU). It takes up to a few seconds and uses the whole
// device: do not run it beside other work. ErrNotSupported where the backend has no measurement.
func (e *Engine) Measure(bytes int64) (Ceilings, error) {
	const op = "Engine.Measure"
	if err := e.check(op); err != nil {
		return Ceilings{}, err
	}
	if bytes < 0 {
		return Ceilings{}, newErr(op, ErrorInvalid, "bytes %d must be >= 0 (0 = the backend's default)", bytes)
	}
	c, err := e.dev.Measure(uint64(bytes))
	if err != nil {
		return Ceilings{}, wrapErr(op, "backend "+e.info.Backend, err)
	}
	return Ceilings{ReadGBps: c.ReadGBps, PeakGFLOPs: c.PeakGFLOPs, Method: c.Method}, nil
}

// Open opens a device with the given options (default: backend "auto", device -1, all CPUs, silent).
// It fails with ErrNoDevice when the backend is not compiled in or has no such device, ErrVersion when
// the native library was built for another ABI, ErrInvalid for a bad option. In a build without cgo it
// fails with an ErrNoDevice whose cause is ErrNoCgo.
func Open(opts ...Option) (*Engine, error) {
	const op = "Open"
	cfg := engineConfig{backend: "auto", device: -1, logger: zerolog.Nop()}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	switch {
	case cfg.threads < 0:
		return nil, newErr(op, ErrorInvalid, "WithThreads(%d): threads must be >= 0 (0 = all CPUs)", cfg.threads)
	case cfg.device < -1:
		return nil, newErr(op, ErrorInvalid, "WithDevice(%d): index must be >= -1 (-1 = the backend's choice)", cfg.device)
	case cfg.backend == "":
		return nil, newErr(op, ErrorInvalid, `WithBackend(""): name is empty (want "auto", "cpu", "vulkan", "metal" or "sycl")`)
	}
	if !bridge.CgoEnabled {
		return nil, &Error{Op: op, Code: ErrorNoDevice, Msg: ErrNoCgo.Error(), cause: ErrNoCgo}
	}
	e := &Engine{cfg: cfg, caches: make(map[*Cache]struct{})}
	if cfg.hasLog {
		// Registered before the device opens, so that what the backend logs while opening it (driver and
		// validation-layer messages) reaches the logger too.
		if cfg.backend != "auto" {
			name := cfg.backend
			e.logBackend.Store(&name)
		}
		if err := logRegister(e); err != nil {
			return nil, wrapErr(op, "log callback", err)
		}
	}
	fail := func(err error) (*Engine, error) {
		if cfg.hasLog {
			logUnregister(e)
		}
		return nil, wrapErr(op, "backend "+cfg.backend, err)
	}
	dev, err := bridge.OpenDevice(cfg.backend, cfg.device, cfg.threads)
	if err != nil {
		return fail(err)
	}
	info, err := dev.Info()
	if err != nil {
		_ = dev.Close()
		return fail(err)
	}
	e.dev, e.info = dev, info
	e.logBackend.Store(&e.info.Backend)
	cfg.logger.Debug().Str("backend", info.Backend).Str("op", op).Str("device", info.Name).
		Str("features", info.Features).Int("threads", info.Threads).Msg("gokv engine opened")
	return e, nil
}

// DeviceInfo describes an engine's device and what it can do, so an engine can ask before NewCache
// (which fails with ErrNotSupported naming what a cache needs and the device lacks).
type DeviceInfo struct {
	Backend      string       // "cpu", "vulkan", "metal", "sycl"
	Name         string       // the device's name (CPU: the processor model)
	Features     string       // CPU: the SIMD paths chosen, e.g. "avx512f avx512vnni fma"
	MemoryBytes  uint64       // device memory (CPU: physical RAM)
	SubgroupSize int          // GPU subgroup size; CPU: SIMD width in floats of the chosen path
	Threads      int          // worker threads in use
	Formats      []FormatKind // the storage formats the device supports
	Caps         DeviceCaps
}

// DeviceCaps are the attention features a device implements.
type DeviceCaps struct {
	Decode       bool // one query per sequence (split-K)
	Prefill      bool // many causal queries per sequence
	LearnedSinks bool // gpt-oss sink logits in the softmax
	Window       bool // sliding windows and sink tokens (also what SinkWindow eviction needs)
	MLA          bool // values as a prefix of the keys (DeepSeek's absorbed MLA)
	Holes        bool // released pages inside a sequence
	Baseline     bool // the dequantize-then-attend reference path (PagedAttend.Baseline)
	Mass         bool // attention mass output (what H2O and SnapKV eviction rank tokens by)
	KVHeadMasks  bool // one validity mask per kv head (what H2O and SnapKV eviction hide tokens with)
	Quest        bool // pools with key bounds and Quest's page selection in decode (Quest eviction)
}

// Supports reports whether the device can store format f.
func (i DeviceInfo) Supports(f FormatKind) bool { return slices.Contains(i.Formats, f) }

func deviceInfo(i bridge.DeviceInfo) DeviceInfo {
	d := DeviceInfo{Backend: i.Backend, Name: i.Name, Features: i.Features, MemoryBytes: i.MemoryBytes,
		SubgroupSize: i.SubgroupSize, Threads: i.Threads,
		Caps: DeviceCaps{Decode: i.Caps.Has(bridge.CapDecode), Prefill: i.Caps.Has(bridge.CapPrefill),
			LearnedSinks: i.Caps.Has(bridge.CapLearnedSinks), Window: i.Caps.Has(bridge.CapWindow),
			MLA: i.Caps.Has(bridge.CapMLA), Holes: i.Caps.Has(bridge.CapHoles), Baseline: i.Caps.Has(bridge.CapBaseline),
			Mass: i.Caps.Has(bridge.CapMass), KVHeadMasks: i.Caps.Has(bridge.CapKVHeadMasks),
			Quest: i.Caps.Has(bridge.CapQuest)}}
	for _, k := range []FormatKind{F32, F16, Q8, Q4, KIVI2, KIVI4} {
		if i.SupportsFormat(bridge.Format(k)) {
			d.Formats = append(d.Formats, k)
		}
	}
	return d
}

// Info returns the device's description. It fails with ErrClosed after Close.
func (e *Engine) Info() (DeviceInfo, error) {
	if err := e.check("Engine.Info"); err != nil {
		return DeviceInfo{}, err
	}
	i, err := e.dev.Info()
	if err != nil {
		return DeviceInfo{}, wrapErr("Engine.Info", "", err)
	}
	return deviceInfo(i), nil
}

// check fails with ErrClosed once the engine is closed, and with ErrInvalid for a nil engine or one that
// did not come from Open.
func (e *Engine) check(op string) error {
	if e == nil {
		return newErr(op, ErrorInvalid, "engine is nil (open one with gokv.Open)")
	}
	if e.dev == nil {
		return newErr(op, ErrorInvalid, "engine was not opened (a zero Engine; open one with gokv.Open)")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return newErr(op, ErrorClosed, "engine is closed")
	}
	return nil
}

// Close closes the engine's caches and its device. It is idempotent and safe on a nil or zero Engine.
func (e *Engine) Close() error {
	if e == nil || e.dev == nil {
		return nil
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	caches := make([]*Cache, 0, len(e.caches))
	for c := range e.caches {
		caches = append(caches, c)
	}
	e.mu.Unlock()
	for _, c := range caches {
		_ = c.Close()
	}
	if e.cfg.hasLog {
		logUnregister(e)
	}
	err := e.dev.Close()
	e.cfg.logger.Debug().Str("backend", e.info.Backend).Str("op", "Engine.Close").Msg("gokv engine closed")
	return wrapErr("Engine.Close", "", err)
}

// logger returns the engine's logger (zerolog.Nop() by default).
func (e *Engine) logger() *zerolog.Logger { return &e.cfg.logger }

// ---- native log forwarding: one process-wide callback, fanned out to the engines with loggers ----

var (
	logEnginesMu sync.Mutex
	logEngines   []*Engine
)

// logRegister adds e to the receivers and (re)installs the native callback at the lowest level any
// receiver wants.
func logRegister(e *Engine) error {
	logEnginesMu.Lock()
	defer logEnginesMu.Unlock()
	logEngines = append(logEngines, e)
	if err := logInstall(); err != nil {
		logEngines = logEngines[:len(logEngines)-1]
		_ = logInstall()
		return err
	}
	return nil
}

func logUnregister(e *Engine) {
	logEnginesMu.Lock()
	defer logEnginesMu.Unlock()
	for i, x := range logEngines {
		if x == e {
			logEngines = append(logEngines[:i], logEngines[i+1:]...)
			break
		}
	}
	_ = logInstall()
}

// logInstall installs (or removes) the native callback for the current receivers; logEnginesMu is held.
func logInstall() error {
	if len(logEngines) == 0 {
		return bridge.SetLogFunc(nil, bridge.LogError)
	}
	minLevel := bridge.LogError
	receivers := append([]*Engine(nil), logEngines...)
	for _, e := range receivers {
		if l := nativeLevel(e.cfg.logger.GetLevel()); l < minLevel {
			minLevel = l
		}
	}
	return bridge.SetLogFunc(func(level int, backend, op, msg string) {
		for _, e := range receivers {
			if b := e.logBackend.Load(); backend != "" && b != nil && backend != *b {
				continue
			}
			e.cfg.logger.WithLevel(zerologLevel(level)).Str("backend", backend).Str("op", op).Msg(msg)
		}
	}, minLevel)
}

// nativeLevel maps a zerolog level to the lowest native level that logger would print.
func nativeLevel(l zerolog.Level) int {
	switch {
	case l <= zerolog.DebugLevel:
		return bridge.LogDebug
	case l == zerolog.InfoLevel:
		return bridge.LogInfo
	case l == zerolog.WarnLevel:
		return bridge.LogWarn
	}
	return bridge.LogError
}

func zerologLevel(native int) zerolog.Level {
	switch native {
	case bridge.LogDebug:
		return zerolog.DebugLevel
	case bridge.LogInfo:
		return zerolog.InfoLevel
	case bridge.LogWarn:
		return zerolog.WarnLevel
	}
	return zerolog.ErrorLevel
}
