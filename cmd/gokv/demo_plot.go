package main

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writeDemoPlot draws the demo's two panels side by side, one line per format: decode latency (ms per
// step) and KV memory in use (MiB), both against the context, and writes them as a PNG.
func writeDemoPlot(path string, rep demoReport) error {
	latency, memory := plot.New(), plot.New()
	latency.Title.Text = fmt.Sprintf("decode step, %d layers of %s", rep.LayersRun, rep.Model)
	latency.X.Label.Text, latency.Y.Label.Text = "context (tokens)", "ms per step"
	memory.Title.Text = "KV cache in use"
	memory.X.Label.Text, memory.Y.Label.Text = "context (tokens)", "MiB"
	var latLines, memLines []any
	for _, f := range rep.Formats {
		lat, mem := make(plotter.XYs, len(f.Points)), make(plotter.XYs, len(f.Points))
		for i, p := range f.Points {
			lat[i] = plotter.XY{X: float64(p.Context), Y: p.Ms}
			mem[i] = plotter.XY{X: float64(p.Context), Y: float64(p.Bytes) / (1 << 20)}
		}
		latLines = append(latLines, f.Format, lat)
		memLines = append(memLines, f.Format, mem)
	}
	if err := plotutil.AddLinePoints(latency, latLines...); err != nil {
		return err
	}
	if err := plotutil.AddLinePoints(memory, memLines...); err != nil {
		return err
	}
	for _, p := range []*plot.Plot{latency, memory} {
		p.Legend.Top, p.Legend.Left = true, true
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
	}

	const width, height = 12 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 2,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{latency, memory}}, tiles, dc)
	latency.Draw(canvases[0][0])
	memory.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}
