//go:build race

package llama

// raceEnabled shrinks the float64 reference's text under the race detector, which slows its plain Go
// loops about tenfold (the matmuls are gonum's assembly, which it does not instrument).
const raceEnabled = true
