package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDemoTinyWritesPlotAndReport(t *testing.T) {
	plotPath := filepath.Join(t.TempDir(), "demo.png")
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"demo", "--json", "-q", "--backend", "cpu", "--context", "256", "--layers", "2", "--steps", "2",
		"--chunk", "64", "--plot", plotPath})
	require.NoError(t, root.Execute())
	var rep demoReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep))
	assert.Equal(t, "llama-3.1-8b", rep.Model)
	assert.Equal(t, 2, rep.LayersRun)
	assert.Equal(t, 32, rep.Layers)
	assert.Equal(t, 256+2, rep.Context, "the context plus the last checkpoint's decode steps")
	assert.Contains(t, rep.NotRun, "perplexity")
	require.Len(t, rep.Formats, 3)
	byFormat := map[string]demoFormat{}
	for _, f := range rep.Formats {
		byFormat[f.Format] = f
		assert.Len(t, f.Points, 4)
		assert.Greater(t, f.DecodeMs, 0.0)
		assert.Greater(t, f.BytesUsed, uint64(0))
		assert.Greater(t, f.CosVsF32, 0.5)
		assert.LessOrEqual(t, f.SinkWindowBytes, f.BytesUsed)
	}
	assert.Greater(t, byFormat["f16"].CosVsF32, 0.99999)
	assert.Greater(t, byFormat["f16"].BytesUsed, byFormat["q4:32"].BytesUsed)
	assert.EqualValues(t, int64(32*131072*4096), byFormat["f16"].FullModelAt128K, "gokv plan: 32 layers x 4 KiB/token")

	f, err := os.Open(plotPath)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 100)
}

func TestDemoHumanOutputAndNoPlot(t *testing.T) {
	dir := t.TempDir()
	wd, err := os.Getwd()
	require.NoError(t, err)
	require.NoError(t, os.Chdir(dir))
	defer os.Chdir(wd)
	var out bytes.Buffer
	root := newRootCmd(&out, &bytes.Buffer{})
	root.SetArgs([]string{"demo", "-q", "--backend", "cpu", "--context", "128", "--layers", "1", "--steps", "1",
		"--formats", "q4,kivi2:32:32", "--no-plot"})
	require.NoError(t, root.Execute())
	s := out.String()
	assert.Contains(t, s, "q4:32")
	assert.Contains(t, s, "kivi2:32:32")
	assert.Contains(t, s, "SinkWindow{Sinks: 4, Window: 1024}")
	assert.Contains(t, s, "not run: perplexity")
	_, err = os.Stat(filepath.Join(dir, "gokv-demo.png"))
	assert.True(t, os.IsNotExist(err), "--no-plot writes no file")
}

func TestDemoErrors(t *testing.T) {
	for _, c := range []struct {
		args     []string
		contains string
	}{
		{[]string{"demo", "--layers", "99"}, "--layers 99"},
		{[]string{"demo", "--formats", "q9"}, "--formats"},
		{[]string{"demo", "--model", "nope"}, "nope"},
	} {
		root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
		root.SetArgs(append(c.args, "-q", "--no-plot"))
		err := root.Execute()
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.contains)
	}
}
