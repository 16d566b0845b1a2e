//go:build !cgo

package bridge

// Without cgo there is no native code: the types and constants stay (types.go, errors.go), and every call
// that needs a device or the C core fails with ErrNoCgo. Package gokv's formats, model specs, HF configs
// and Plan need none of it.

// CgoEnabled reports whether the native code is linked (false: built with CGO_ENABLED=0).
const CgoEnabled = false

// ABIHeaderVersion is the ABI version this package was written against (GOKV_ABI_VERSION in gokv.h).
const ABIHeaderVersion = uint32(1)

// ErrNoCgo is what every native call returns in a build without cgo (an ErrNoDevice).
var ErrNoCgo = &Error{Code: codeNoDev, Name: statusName(codeNoDev), Msg: "gokv was built without cgo " +
	"(CGO_ENABLED=0): no native backend is available; formats, model specs, HF configs and Plan work without it"}

// ABIVersion returns 0: no C library is linked.
func ABIVersion() uint32 { return 0 }

// Backends returns no backend: none is compiled in.
func Backends() []string { return nil }

// KIVIQuantizedLen is gokv_kivi_quantized_len in Go.
func KIVIQuantizedLen(n, group, residual int) int { return kiviQuantizedLenGo(n, group, residual) }

// Device is never opened without cgo.
type Device struct{}

// Pool is never created without cgo.
type Pool struct{ desc PoolDesc }

func noCgo(op string) error {
	return &Error{Op: op, Code: ErrNoCgo.Code, Name: ErrNoCgo.Name, Msg: op + ": " + ErrNoCgo.Msg}
}

func OpenDevice(string, int, int) (*Device, error)         { return nil, noCgo("gokv_device_open") }
func (d *Device) Info() (DeviceInfo, error)                { return DeviceInfo{}, noCgo("gokv_device_info_get") }
func (d *Device) Measure(uint64) (Ceilings, error)         { return Ceilings{}, noCgo("gokv_device_measure") }
func (d *Device) Close() error                             { return nil }
func NewPool(*Device, PoolDesc) (*Pool, error)             { return nil, noCgo("gokv_pool_create") }
func (p *Pool) Desc() PoolDesc                             { return p.desc }
func (p *Pool) Device() *Device                            { return nil }
func (p *Pool) Sizes() (uint64, uint64, error)             { return 0, 0, noCgo("gokv_pool_sizes") }
func (p *Pool) Write(WriteBatch) error                     { return noCgo("gokv_pool_write") }
func (p *Pool) Read(ReadBatch) error                       { return noCgo("gokv_pool_read") }
func (p *Pool) Copy(CopyBatch) error                       { return noCgo("gokv_pool_copy") }
func (p *Pool) Gather(GatherBatch) error                   { return noCgo("gokv_pool_gather_rows") }
func (p *Pool) PageBytes(int) ([]byte, error)              { return nil, noCgo("gokv_pool_page_bytes") }
func (p *Pool) SlotBytes(int) ([]byte, error)              { return nil, noCgo("gokv_pool_slot_bytes") }
func (p *Pool) SetPageBytes(int, []byte, int) error        { return noCgo("gokv_pool_set_page_bytes") }
func (p *Pool) SetSlotBytes(int, []byte) error             { return noCgo("gokv_pool_set_slot_bytes") }
func (p *Pool) Close() error                               { return nil }
func Attend(*Device, AttendBatch) error                    { return noCgo("gokv_attend") }
func AppendAttend(*Device, *WriteBatch, AttendBatch) error { return noCgo("gokv_append_attend") }
func SizesOf(PoolDesc) (LayoutSizes, error)                { return LayoutSizes{}, noCgo("gokv_layout_sizes_get") }
func InjectFault(string, int, int) error                   { return noCgo("gokv_inject_fault") }

// SetLogFunc accepts nil (silence, which a build without cgo already is) and fails otherwise.
func SetLogFunc(fn LogFunc, _ int) error {
	if fn == nil {
		return nil
	}
	return noCgo("gokv_set_log_callback")
}
