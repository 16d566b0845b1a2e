package main

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// evalPlotSmooth is the moving-average window, in positions, of the plotted bits per byte: one byte's
// bits swing by several bits, and a few sequences do not average that out.
const evalPlotSmooth = 16

// writeEvalPlot draws each run's bits per byte against position (mean over the sequences, a centred
// moving average over evalPlotSmooth positions), one panel per model and one line per (format,
// eviction), as a PNG.
func writeEvalPlot(path string, rows []evalRow) error {
	var models []string
	byModel := map[string][]evalRow{}
	for _, r := range rows {
		if byModel[r.Model] == nil {
			models = append(models, r.Model)
		}
		byModel[r.Model] = append(byModel[r.Model], r)
	}
	var panels [][]*plot.Plot
	for _, model := range models {
		p := plot.New()
		p.Title.Text = "gokv eval: " + model + ", bits per byte by position"
		p.X.Label.Text = fmt.Sprintf("position of the predicted byte (mean over sequences, %d-position moving average)", evalPlotSmooth)
		p.Y.Label.Text = "bits per byte"
		var lines []any
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range byModel[model] {
			pts := smoothCurve(r.curve, evalPlotSmooth)
			for _, pt := range pts {
				lo, hi = min(lo, pt.Y), max(hi, pt.Y)
			}
			lines = append(lines, r.Format+" "+r.Eviction, pts)
		}
		if err := plotutil.AddLines(p, lines...); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		// Room above the curves for the legend: a legend line is about 1/25 of the panel's height.
		if n := len(byModel[model]); hi > lo {
			p.Y.Min, p.Y.Max = lo, hi+(hi-lo)*float64(n)/max(25-float64(n), 1)
		}
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
		panels = append(panels, []*plot.Plot{p})
	}

	width, height := 10*vg.Inch, vg.Length(len(panels))*5*vg.Inch
	img := vgimg.New(width, height)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(panels, tiles, draw.New(img))
	for i := range panels {
		panels[i][0].Draw(canvases[i][0])
	}
	return writePNG("--plot", path, img)
}

// smoothCurve returns the points (position, centred mean of ys over up to window positions); ys[i] is
// the bits of the byte at position i+1.
func smoothCurve(ys []float64, window int) plotter.XYs {
	pts := make(plotter.XYs, len(ys))
	for i := range ys {
		lo, hi := max(0, i-window/2), min(len(ys), i+window-window/2)
		sum := 0.0
		for _, y := range ys[lo:hi] {
			sum += y
		}
		pts[i] = plotter.XY{X: float64(i + 1), Y: sum / float64(hi-lo)}
	}
	return pts
}
