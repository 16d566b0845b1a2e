package llama

import (
	"math"
	"runtime"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// The row-wise math of the forward pass, all on float32 rows laid out [rows, width].

// rmsNorm writes x·rsqrt(mean(x²)+eps)·w for each row of x into dst. The mean is summed in float64: HF
// sums float32 with a pairwise reduction, and float64 is at least as close to the exact value as that.
func rmsNorm(dst, x, w []float32, eps float64) {
	n := len(w)
	for r := 0; r+n <= len(x); r += n {
		row, out := x[r:r+n], dst[r:r+n]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(n)+eps))
		for i, v := range row {
			out[i] = w[i] * (v * inv)
		}
	}
}

// rope rotates every head of one row in place by the angles in cos and sin ([d/2] each): HF's rotate-half,
// which pairs dim i with dim i+d/2: (x_i, x_{i+d/2}) -> (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos + x_i sin).
func rope(row []float32, headDim int, cos, sin []float32) {
	half := headDim / 2
	for h := 0; h+headDim <= len(row); h += headDim {
		a, b := row[h:h+half], row[h+half:h+headDim]
		for i := range a {
			x, y := a[i], b[i]
			a[i] = x*cos[i] - y*sin[i]
			b[i] = y*cos[i] + x*sin[i]
		}
	}
}

// swiGLU writes silu(gate)·up into gate (silu(x) = x·sigmoid(x)).
func swiGLU(gate, up []float32) {
	for i, g := range gate {
		gate[i] = g / (1 + float32(math.Exp(float64(-g)))) * up[i]
	}
}

// addInPlace adds y to x.
func addInPlace(x, y []float32) {
	for i := range x {
		x[i] += y[i]
	}
}

// linear computes dst[r] = W · x[r] for every row r of x ([rows, In] -> [rows, Out]).
//
// gonum's Sgemv (assembly dot products over W's rows) runs at ~25 GFLOP/s on one core of the development
// machine for these shapes, where its Sgemm with W transposed ran at 5-15 and a plain Go loop at ~2.
// Large products are split by W's output rows over GOMAXPROCS goroutines, each streaming its own part of
// W once per x row, so a one-row decode is parallel too.
func linear(dst, x []float32, w matrix) {
	rows := len(x) / w.In
	workers := runtime.GOMAXPROCS(0)
	if rows*w.Out*w.In < linearParallelMACs || workers < 2 {
		gemvRows(dst, x, w, 0, w.Out)
		return
	}
	workers = min(workers, w.Out/linearMinRowsPerWorker)
	if workers < 2 {
		gemvRows(dst, x, w, 0, w.Out)
		return
	}
	var wg sync.WaitGroup
	chunk := (w.Out + workers - 1) / workers
	for lo := 0; lo < w.Out; lo += chunk {
		hi := min(lo+chunk, w.Out)
		wg.Add(1)
		go func() {
			defer wg.Done()
			gemvRows(dst, x, w, lo, hi)
		}()
	}
	wg.Wait()
}

// Below linearParallelMACs multiply-adds (about 0.2 ms on one core) a product runs on the calling
// goroutine. Splitting decode-sized products (16 rows of 688x256: 2.8M) was 10-15% slower per token on
// the shared 2-core development machine, where the second core is also the gokv CPU backend's and other
// processes'; prefill-sized products gain from it.
const (
	linearParallelMACs     = 1 << 22
	linearMinRowsPerWorker = 32
)

// gemvRows computes output rows [lo, hi) of W·x[r] for every row r of x.
func gemvRows(dst, x []float32, w matrix, lo, hi int) {
	var impl gonum.Implementation
	rows := len(x) / w.In
	sub := w.Data[lo*w.In : hi*w.In]
	for r := 0; r < rows; r++ {
		impl.Sgemv(blas.NoTrans, hi-lo, w.In, 1, sub, w.In, x[r*w.In:(r+1)*w.In], 1, 0, dst[r*w.Out+lo:r*w.Out+hi], 1)
	}
}
