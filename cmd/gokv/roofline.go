package main

// ceilings are the machine's two limits of docs/architecture.md §9, measured on the machine bench runs on.
type ceilings struct {
	ReadGBps   float64 // streaming read bandwidth, 1e9 bytes/s
	PeakGFLOPs float64 // float32 FMA peak, an FMA counting 2; 0 if not measured
	Source     string  // how they were measured
}

// floorMs is the time below which no kernel can go: max(bytes / bandwidth, flops / peak), in ms. A
// ceiling that is 0 (not measured) drops out.
func (c ceilings) floorMs(bytes, flops float64) float64 {
	floor := 0.0
	if c.ReadGBps > 0 {
		floor = bytes / (c.ReadGBps * 1e9)
	}
	if c.PeakGFLOPs > 0 {
		floor = max(floor, flops/(c.PeakGFLOPs*1e9))
	}
	return floor * 1e3
}
