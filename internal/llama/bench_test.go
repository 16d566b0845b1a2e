package llama

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gokv/gokv/gokv"
)

// BenchmarkLinear compares linear (gonum's Sgemv per row) with a plain Go loop on the model's largest
// product, 688x256, for a decode batch of 16 rows.
func BenchmarkLinear(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := matrix{Out: 688, In: 256, Data: make([]float32, 688*256)}
	x, y := make([]float32, 16*256), make([]float32, 16*688)
	for i := range w.Data {
		w.Data[i] = rng.Float32() - 0.5
	}
	for i := range x {
		x[i] = rng.Float32() - 0.5
	}
	flops := float64(2 * 16 * 688 * 256)
	b.Run("gonum", func(b *testing.B) {
		for b.Loop() {
			linear(y, x, w)
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
	b.Run("loop", func(b *testing.B) {
		for b.Loop() {
			for r := 0; r < 16; r++ {
				for o := 0; o < w.Out; o++ {
					var s float32
					row := w.Data[o*w.In : (o+1)*w.In]
					for i, v := range x[r*w.In : (r+1)*w.In] {
						s += row[i] * v
					}
					y[r*w.Out+o] = s
				}
			}
		}
		b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}

// BenchmarkDecode times decode steps of tiny-llama at context 512 (the sequences' last positions) for a
// batch of K sequences, reporting the whole step and the attention (Step.Layer) per token.
func BenchmarkDecode(b *testing.B) {
	m, err := Load(modelDir("tiny-llama"))
	require.NoError(b, err)
	if len(gokv.Backends()) == 0 {
		b.Skip("no native backend: built without cgo")
	}
	eng, err := gokv.Open(gokv.WithBackend("cpu"))
	require.NoError(b, err)
	defer eng.Close()
	// Context 1024 is twice what the model was trained at: RoPE extrapolates, so only its timing means
	// anything (what a decode step costs once the cache is that long).
	for _, ctx := range []int{512, 1024} {
		for _, format := range []string{"f32", "q4"} {
			for _, k := range []int{1, 16} {
				b.Run(fmt.Sprintf("ctx=%d/%s/K=%d", ctx, format, k), func(b *testing.B) {
					benchDecode(b, m, eng, format, k, ctx)
				})
			}
		}
	}
}

// benchDecode times decode steps of k sequences in the last 64 positions of a context of ctx tokens.
func benchDecode(b *testing.B, m *Model, eng *gokv.Engine, format string, k, ctx int) {
	cache, err := m.NewCache(eng, gokv.CacheOptions{Format: gokv.MustParseFormat(format), MaxTokens: k*(ctx+64) + 64,
		MaxSequences: k})
	require.NoError(b, err)
	defer cache.Close()
	r := m.NewRunner(cache)
	entries := make([]Entry, k)
	prompt := make([]int, ctx-64)
	prompt[0] = m.Config.BOS
	for s := range entries {
		seq, err := cache.NewSequence()
		require.NoError(b, err)
		entries[s] = Entry{Seq: seq, Tokens: prompt}
	}
	_, err = r.Step(entries...)
	require.NoError(b, err)
	var total, attn float64
	tokens := 0
	for i := 0; b.Loop(); i++ {
		if entries[0].Seq.Len() >= ctx { // stay in the last 64 positions of the context
			b.StopTimer()
			for s := range entries {
				require.NoError(b, entries[s].Seq.Truncate(ctx-64))
			}
			b.StartTimer()
		}
		for s := range entries {
			entries[s].Tokens = []int{i % 256}
		}
		out, err := r.Step(entries...)
		require.NoError(b, err)
		total += out.Timing.Total.Seconds()
		attn += out.Timing.Attention.Seconds()
		tokens += k
	}
	b.ReportMetric(total*1e3/float64(tokens), "ms/token")
	b.ReportMetric(attn*1e3/float64(tokens), "attn-ms/token")
}
