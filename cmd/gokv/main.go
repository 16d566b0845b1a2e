// Command gokv is the command line tool of gokv: compressed KV caches and fused attention for LLM inference.
//
//	gokv info     backends compiled in and the devices they find
//	gokv plan     KV cache memory of a model at a context, and the largest context a memory budget allows
//	gokv attend   attention over K/V read from .npy files, stored through a chosen format
//	gokv bench    decode (and prefill) attention speed per format and context, against the machine's floor
//	gokv demo     long-context decode on a model's shape through the cache API, f16 vs q4 vs kivi2
//	gokv eval     bits per byte, agreement with f32 and speed of each format on a real byte-level Llama
//	gokv generate a byte-level Llama's continuation of a prompt, through a cache in a chosen format
//
// Every subcommand prints human-readable text by default and JSON with --json. Logs (and the progress
// bars of bench, demo and eval) go to stderr, results to stdout; generate streams its text to stdout and
// ends with a stats line on stderr.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCmd(os.Stdout, os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is how a failed command reports: "gokv: " once, although the library's errors carry that
// prefix too and the flags' messages wrap them ("--format: gokv: ParseFormat: ...").
func errorLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), ": gokv: ", ": ")
	return "gokv: " + strings.TrimPrefix(msg, "gokv: ")
}

// globalOpts are the flags every subcommand shares.
type globalOpts struct {
	logLevel string
	quiet    bool // no progress bars
}

// newRootCmd builds the command tree writing results to stdout and logs and progress to stderr; tests
// call it with buffers.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globalOpts{}
	root := &cobra.Command{
		Use:   "gokv",
		Short: "Compressed KV caches and fused attention for LLM inference",
		Long: `gokv stores an LLM's attention keys and values compressed (f16, q8, q4, KIVI 2/4-bit) and
computes attention directly on the compressed data.

Formats: f32, f16, q8[:G], q4[:G], kivi2[:G[:R]], kivi4[:G[:R]] (G group 32/64/128, default 32; R KIVI's
full-precision recent tokens, default 128).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return setupLogging(g, stderr)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	root.PersistentFlags().BoolVarP(&g.quiet, "quiet", "q", false, "no progress bars")
	root.AddCommand(newInfoCmd(g), newPlanCmd(g), newAttendCmd(g), newBenchCmd(g), newDemoCmd(g), newEvalCmd(g), newGenerateCmd(g), newTurnsCmd(g))
	root.AddCommand(newInspectCmd(g))
	return root
}

// logger is the CLI's logger: human-readable on stderr (the library's own default is silent:
// docs/architecture.md §3).
var logger = zerolog.Nop()

// setupLogging installs the console logger at the chosen level. Every engine the CLI opens logs to it
// (gokv.WithLogger), the native code's messages included, with their backend and op.
func setupLogging(g *globalOpts, stderr io.Writer) error {
	level, err := zerolog.ParseLevel(g.logLevel)
	if err != nil || level == zerolog.NoLevel {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: time.TimeOnly}).
		Level(level).With().Timestamp().Logger()
	return nil
}
