package llama

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A second, independent Llama forward pass in float64, sharing nothing with the package but the files it
// reads: its own config and safetensors reading (trusting the committed files), RMSNorm, RoPE, causal
// attention with sinks, and MLP, written from the HF math, with the whole sequence at once and no cache.

type f64Model struct {
	hidden, inter, layers, hq, hkv, d, vocab int
	eps, theta                               float64
	sinks                                    bool
	t                                        map[string][]float64
}

func loadF64(t *testing.T, dir string) *f64Model {
	t.Helper()
	var cfg struct {
		Hidden int     `json:"hidden_size"`
		Inter  int     `json:"intermediate_size"`
		Layers int     `json:"num_hidden_layers"`
		HQ     int     `json:"num_attention_heads"`
		HKV    int     `json:"num_key_value_heads"`
		D      int     `json:"head_dim"`
		Vocab  int     `json:"vocab_size"`
		Eps    float64 `json:"rms_norm_eps"`
		Theta  float64 `json:"rope_theta"`
		Sinks  string  `json:"attention_sinks"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &cfg))
	m := &f64Model{hidden: cfg.Hidden, inter: cfg.Inter, layers: cfg.Layers, hq: cfg.HQ, hkv: cfg.HKV, d: cfg.D,
		vocab: cfg.Vocab, eps: cfg.Eps, theta: cfg.Theta, sinks: cfg.Sinks == "learned", t: map[string][]float64{}}

	file, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	require.NoError(t, err)
	n := binary.LittleEndian.Uint64(file)
	var header map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(file[8:8+n], &header))
	body := file[8+n:]
	for name, raw := range header {
		if name == "__metadata__" {
			continue
		}
		var info struct {
			DType   string   `json:"dtype"`
			Offsets [2]int64 `json:"data_offsets"`
		}
		require.NoError(t, json.Unmarshal(raw, &info))
		require.Equal(t, "F32", info.DType, name)
		b := body[info.Offsets[0]:info.Offsets[1]]
		x := make([]float64, len(b)/4)
		for i := range x {
			x[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
		m.t[name] = x
	}
	return m
}

func (m *f64Model) w(name string) []float64 { return m.t[name] }

// matmul returns W x_t for every row x_t of xs, W [out, len(x_t)]. Each row of W is read once for all
// of xs, so W streams through the cache once per call.
func matmul(w []float64, xs [][]float64) [][]float64 {
	in := len(xs[0])
	out := len(w) / in
	ys := make([][]float64, len(xs))
	for t := range ys {
		ys[t] = make([]float64, out)
	}
	for o := 0; o < out; o++ {
		row := w[o*in : (o+1)*in]
		t := 0
		for ; t+4 <= len(xs); t += 4 { // four rows at once: each weight loaded once, four independent sums
			x0, x1, x2, x3 := xs[t][:in], xs[t+1][:in], xs[t+2][:in], xs[t+3][:in]
			var s0, s1, s2, s3 float64
			for i, a := range row {
				s0 += a * x0[i]
				s1 += a * x1[i]
				s2 += a * x2[i]
				s3 += a * x3[i]
			}
			ys[t][o], ys[t+1][o], ys[t+2][o], ys[t+3][o] = s0, s1, s2, s3
		}
		for ; t < len(xs); t++ {
			s := 0.0
			for i, v := range xs[t] {
				s += row[i] * v
			}
			ys[t][o] = s
		}
	}
	return ys
}

func (m *f64Model) norm(x, w []float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	r := 1 / math.Sqrt(ss/float64(len(x))+m.eps)
	y := make([]float64, len(x))
	for i := range x {
		y[i] = x[i] * r * w[i]
	}
	return y
}

// rotate applies rotate-half RoPE at position p to every head of x.
func (m *f64Model) rotate(x []float64, p int) {
	half := m.d / 2
	for h := 0; h < len(x)/m.d; h++ {
		head := x[h*m.d : (h+1)*m.d]
		for i := 0; i < half; i++ {
			ang := float64(p) / math.Pow(m.theta, float64(2*i)/float64(m.d))
			c, s := math.Cos(ang), math.Sin(ang)
			a, b := head[i], head[i+half]
			head[i], head[i+half] = a*c-b*s, b*c+a*s
		}
	}
}

// logProbs runs the whole sequence and returns log softmax of every position's logits.
func (m *f64Model) logProbs(ids []int) [][]float64 {
	T, H := len(ids), m.hidden
	x := make([][]float64, T)
	emb := m.w("model.embed_tokens.weight")
	for t, id := range ids {
		x[t] = append([]float64(nil), emb[id*H:(id+1)*H]...)
	}
	for l := 0; l < m.layers; l++ {
		p := "model.layers." + strconv.Itoa(l) + "."
		h := make([][]float64, T)
		for t := range x {
			h[t] = m.norm(x[t], m.w(p+"input_layernorm.weight"))
		}
		q, k, v := matmul(m.w(p+"self_attn.q_proj.weight"), h), matmul(m.w(p+"self_attn.k_proj.weight"), h),
			matmul(m.w(p+"self_attn.v_proj.weight"), h)
		for t := range x {
			m.rotate(q[t], t)
			m.rotate(k[t], t)
		}
		att := make([][]float64, T)
		for t := range x {
			att[t] = make([]float64, m.hq*m.d)
			for h := 0; h < m.hq; h++ {
				g := h / (m.hq / m.hkv)
				qh := q[t][h*m.d : (h+1)*m.d]
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for u := 0; u <= t; u++ {
					ku := k[u][g*m.d : (g+1)*m.d]
					dot := 0.0
					for i, a := range qh {
						dot += a * ku[i]
					}
					s[u] = dot / math.Sqrt(float64(m.d))
					mx = math.Max(mx, s[u])
				}
				sink := math.Inf(-1)
				if m.sinks {
					sink = m.w(p + "self_attn.sinks")[h]
					mx = math.Max(mx, sink)
				}
				den := math.Exp(sink - mx)
				ah := att[t][h*m.d : (h+1)*m.d]
				for u := range s {
					e := math.Exp(s[u] - mx)
					den += e
					vu := v[u][g*m.d : (g+1)*m.d]
					for i, b := range vu {
						ah[i] += e * b
					}
				}
				for i := range ah {
					ah[i] /= den
				}
			}
		}
		o := matmul(m.w(p+"self_attn.o_proj.weight"), att)
		for t := range x {
			for i := range o[t] {
				x[t][i] += o[t][i]
			}
			h[t] = m.norm(x[t], m.w(p+"post_attention_layernorm.weight"))
		}
		gate, up := matmul(m.w(p+"mlp.gate_proj.weight"), h), matmul(m.w(p+"mlp.up_proj.weight"), h)
		for t := range gate {
			for i := range gate[t] {
				gate[t][i] = gate[t][i] / (1 + math.Exp(-gate[t][i])) * up[t][i]
			}
		}
		down := matmul(m.w(p+"mlp.down_proj.weight"), gate)
		for t := range x {
			for i := range down[t] {
				x[t][i] += down[t][i]
			}
		}
	}
	final := make([][]float64, T)
	for t := range x {
		final[t] = m.norm(x[t], m.w("model.norm.weight"))
	}
	out := matmul(m.w("lm_head.weight"), final)
	for _, logits := range out {
		mx := math.Inf(-1)
		for _, z := range logits {
			mx = math.Max(mx, z)
		}
		sum := 0.0
		for _, z := range logits {
			sum += math.Exp(z - mx)
		}
		lse := mx + math.Log(sum)
		for i := range logits {
			logits[i] -= lse
		}
	}
	return out
}

// TestBitsPerByteMatchFloat64 scores held-out text with the package (f32 cache; a prefill of 64 tokens,
// then token-by-token decode of all sequences in one batch) and with the float64 pass: bits per byte must
// agree within 0.5%.
func TestBitsPerByteMatchFloat64(t *testing.T) {
	seqs, n := 4, 512 // 4 x 511 = 2044 bytes scored
	if raceEnabled || testing.Short() {
		seqs, n = 1, 128
	}
	const prefill = 64
	eng := openCPU(t)
	text := heldout(t, seqs*(n-1))
	for _, name := range testModels {
		t.Run(name, func(t *testing.T) {
			m, err := Load(modelDir(name))
			require.NoError(t, err)
			ref := loadF64(t, modelDir(name))
			ids := make([][]int, seqs)
			for s := range ids {
				ids[s] = append([]int{m.Config.BOS}, text[s*(n-1):(s+1)*(n-1)]...)
			}

			// float64, the sequences on separate goroutines.
			bits64 := make([]float64, seqs)
			var wg sync.WaitGroup
			for s := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lp := ref.logProbs(ids[s])
					for p := 0; p+1 < n; p++ {
						bits64[s] -= lp[p][ids[s][p+1]] / math.Ln2
					}
				}()
			}

			cache := newTestCache(t, eng, m, "f32", seqs*n)
			r := m.NewRunner(cache)
			entries := make([]Entry, seqs)
			for s := range entries {
				seq, err := cache.NewSequence()
				require.NoError(t, err)
				entries[s] = Entry{Seq: seq, Tokens: ids[s][:prefill], AllLogits: true}
			}
			bits32 := 0.0
			score := func(logits []float32, next int) {
				mx := math.Inf(-1)
				for _, z := range logits {
					mx = math.Max(mx, float64(z))
				}
				sum := 0.0
				for _, z := range logits {
					sum += math.Exp(float64(z) - mx)
				}
				bits32 -= (float64(logits[next]) - mx - math.Log(sum)) / math.Ln2
			}
			out, err := r.Step(entries...)
			require.NoError(t, err)
			V := m.Config.VocabSize
			for s := range entries {
				for p, row := range rows(out.Logits[s], V) {
					score(row, ids[s][p+1])
				}
			}
			for p := prefill; p+1 < n; p++ {
				for s := range entries {
					entries[s] = Entry{Seq: entries[s].Seq, Tokens: ids[s][p : p+1]}
				}
				out, err := r.Step(entries...)
				require.NoError(t, err)
				for s := range entries {
					score(out.Logits[s], ids[s][p+1])
				}
			}
			wg.Wait()
			scored := float64(seqs * (n - 1))
			bpb32, bpb64 := bits32/scored, 0.0
			for _, b := range bits64 {
				bpb64 += b / scored
			}
			rel := math.Abs(bpb32-bpb64) / bpb64
			t.Logf("%s: %d bytes: bits per byte f32 cache %.6f, float64 %.6f, relative difference %.2e", name, int(scored), bpb32, bpb64, rel)
			assert.Less(t, rel, 0.005)
		})
	}
}
