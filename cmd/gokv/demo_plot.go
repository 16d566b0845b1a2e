package main

import (
	"fmt"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writeDemoPlot draws the demo's panels side by side and writes them as a PNG: decode latency (median,
// with a p10-p90 bar) and KV memory in use, one line per format against the context on a log2 axis
// ticked at the measured contexts, and, when the real-model part ran, its quality per format.
func writeDemoPlot(path string, rep demoReport) error {
	latency, memory := plot.New(), plot.New()
	latency.Title.Text = fmt.Sprintf("decode step, %d layers of %s (median, p10-p90)", rep.LayersRun, rep.Model)
	latency.Y.Label.Text = "ms per step"
	memory.Title.Text = "KV cache in use"
	memory.Y.Label.Text = "MiB"
	var latLines, memLines []any
	var ticks []plot.Tick
	maxMedian, maxP90 := 0.0, 0.0
	for i, f := range rep.Formats {
		lat, mem := make(demoSpreadXYs, len(f.Points)), make(plotter.XYs, len(f.Points))
		for j, p := range f.Points {
			lat[j] = demoSpreadXY{x: float64(p.Context), median: p.Ms, p10: p.MsP10, p90: p.MsP90}
			mem[j] = plotter.XY{X: float64(p.Context), Y: float64(p.Bytes) / (1 << 20)}
			maxMedian, maxP90 = max(maxMedian, p.Ms), max(maxP90, p.MsP90)
			if i == 0 {
				ticks = append(ticks, plot.Tick{Value: float64(p.Context), Label: strconv.Itoa(p.Context)})
			}
		}
		bars, err := plotter.NewYErrorBars(lat)
		if err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		bars.Color = plotutil.Color(i)
		latency.Add(bars)
		latLines = append(latLines, f.Format, lat)
		memLines = append(memLines, f.Format, mem)
	}
	if err := plotutil.AddLinePoints(latency, latLines...); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := plotutil.AddLinePoints(memory, memLines...); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	for _, p := range []*plot.Plot{latency, memory} {
		p.X.Label.Text = "context (tokens, log2 scale)"
		p.X.Scale = plot.LogScale{} // contexts double from one checkpoint to the next
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		if len(ticks) > 0 {
			// Half a doubling of room either side, so the end points are not on the frame.
			p.X.Min, p.X.Max = ticks[0].Value/1.41, ticks[len(ticks)-1].Value*1.41
		}
		p.Legend.Top, p.Legend.Left = true, true
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
	}
	// One step stalled by other load can reach ten times the median; the axis stops at twice the largest
	// median so that the lines stay readable, and such a bar runs off the top.
	if maxP90 > 2*maxMedian {
		latency.Y.Max = 2 * maxMedian
	}
	row := []*plot.Plot{latency, memory}
	if rep.RealModel != nil && len(rep.RealModel.Formats) > 0 {
		quality, err := demoQualityPlot(rep.RealModel)
		if err != nil {
			return err
		}
		row = append(row, quality)
	}

	width, height := vg.Length(len(row))*5*vg.Inch, 4.5*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 2,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}

	return writePNG("--plot", path, img)
}

// demoQualityPlot draws the real model's top-1 agreement with the f32 full cache as one bar per
// format, coloured as the format's lines and labelled with its bits per byte: top-1 separates the
// formats, while bits per byte, the measure a reader knows, moves in the second or third decimal on a
// model this small.
func demoQualityPlot(rm *demoRealModel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (%.1fM params): quality vs f32 full cache", rm.Model, float64(rm.Parameters)/1e6)
	p.Y.Label.Text = "top-1 agreement with f32"
	p.X.Label.Text = fmt.Sprintf("format, bits per byte (f32: %.3f)", rm.Reference.BitsPerByte)
	p.Add(plotter.NewGrid())
	names := make([]string, len(rm.Formats))
	for i, f := range rm.Formats {
		names[i] = fmt.Sprintf("%s\n%.3f bits/B", f.Format, f.BitsPerByte)
		bar, err := plotter.NewBarChart(plotter.Values{f.Top1Agree}, vg.Points(28))
		if err != nil {
			return nil, fmt.Errorf("--plot: %w", err)
		}
		bar.XMin, bar.Color = float64(i), plotutil.Color(i)
		p.Add(bar)
	}
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = 0, 1
	return p, nil
}

// demoSpreadXY is one latency point: its median, drawn as the line, and its p10-p90, as an error bar.
type demoSpreadXY struct{ x, median, p10, p90 float64 }

type demoSpreadXYs []demoSpreadXY

func (s demoSpreadXYs) Len() int                    { return len(s) }
func (s demoSpreadXYs) XY(i int) (float64, float64) { return s[i].x, s[i].median }

// YError returns how far below and above the median p10 and p90 lie (what plotter.YErrorBars draws).
func (s demoSpreadXYs) YError(i int) (float64, float64) {
	return s[i].median - s[i].p10, s[i].p90 - s[i].median
}
