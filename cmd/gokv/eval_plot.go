package main

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// evalPlotSmooth is the moving-average window, in positions, of the plotted bits per byte: one byte's
// bits swing by several bits, and a few sequences do not average that out.
const evalPlotSmooth = 16

// writeEvalPlot draws each run's bits per byte against position (mean over the sequences, a centred
// moving average over evalPlotSmooth positions), one line per (model, format, eviction), as a PNG.
func writeEvalPlot(path string, rows []evalRow) error {
	p := plot.New()
	p.Title.Text = "gokv eval: bits per byte by position"
	p.X.Label.Text = fmt.Sprintf("position (token predicted; mean over sequences, %d-position moving average)", evalPlotSmooth)
	p.Y.Label.Text = "bits per byte"
	models := map[string]bool{}
	for _, r := range rows {
		models[r.Model] = true
	}
	var lines []any
	for _, r := range rows {
		name := r.Format + " " + r.Eviction
		if len(models) > 1 {
			name = r.Model + " " + name
		}
		lines = append(lines, name, smoothCurve(r.curve, evalPlotSmooth))
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	w, err := p.WriterTo(10*vg.Inch, 5*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if _, err := w.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return nil
}

// smoothCurve returns the points (position, centred mean of ys over up to window positions); curve[i]
// is the bits of the byte at position i+1.
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
