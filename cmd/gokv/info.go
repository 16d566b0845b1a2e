package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type infoOpts struct {
	json    bool
	threads int
}

// deviceReport is one backend's device as `gokv info --json` prints it.
type deviceReport struct {
	Backend      string   `json:"backend"`
	Name         string   `json:"name,omitempty"`
	MemoryBytes  uint64   `json:"memory_bytes,omitempty"`
	SubgroupSize int      `json:"subgroup_size,omitempty"` // GPUs
	SIMDWidth    int      `json:"simd_width,omitempty"`    // CPU: floats per vector of the kernels in force
	Features     string   `json:"features,omitempty"`
	Threads      int      `json:"threads,omitempty"`
	Caps         []string `json:"caps,omitempty"`
	Formats      []string `json:"formats,omitempty"`
	Error        string   `json:"error,omitempty"` // why the backend could not be opened
}

type infoReport struct {
	ABIVersion uint32         `json:"abi_version"`
	Backends   []string       `json:"backends"`
	Devices    []deviceReport `json:"devices"`
	Error      string         `json:"error,omitempty"` // why no backend is compiled in (a build without cgo)
}

func newInfoCmd(g *globalOpts) *cobra.Command {
	o := &infoOpts{}
	cmd := &cobra.Command{
		Use:   "info",
		Short: "Backends compiled in and the devices they find",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runInfo(cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	cmd.Flags().IntVar(&o.threads, "threads", 0, "CPU worker threads (0: all online CPUs)")
	return cmd
}

// capNames names the capabilities a device reports.
func capNames(c gokv.DeviceCaps) []string {
	var names []string
	for _, x := range []struct {
		has  bool
		name string
	}{{c.Decode, "decode"}, {c.Prefill, "prefill"}, {c.LearnedSinks, "learned-sinks"}, {c.Window, "window"},
		{c.MLA, "mla"}, {c.Holes, "holes"}, {c.Baseline, "baseline"}, {c.Mass, "mass"}, {c.KVHeadMasks, "kv-head-masks"},
		{c.Quest, "quest"}} {
		if x.has {
			names = append(names, x.name)
		}
	}
	return names
}

// runInfo opens the default device of every backend compiled in and describes it. A backend that fails
// to open (no device, no driver) is listed with its error rather than failing the command.
func runInfo(w io.Writer, o *infoOpts) error {
	rep := infoReport{ABIVersion: uint32(gokv.ABIVersion()), Backends: gokv.Backends()}
	for _, b := range rep.Backends {
		rep.Devices = append(rep.Devices, probeBackend(b, o.threads))
	}
	if len(rep.Backends) == 0 {
		if _, err := gokv.Open(); err != nil {
			rep.Error = err.Error()
		}
	}
	if o.json {
		return writeJSON(w, rep)
	}
	backends := strings.Join(rep.Backends, ", ")
	if backends == "" {
		backends = "none"
	}
	fmt.Fprintf(w, "gokv ABI %d, backends compiled in: %s\n", rep.ABIVersion, backends)
	if rep.Error != "" {
		fmt.Fprintf(w, "  %s\n", rep.Error)
	}
	for _, d := range rep.Devices {
		fmt.Fprintf(w, "\n[%s]\n", d.Backend)
		if d.Error != "" {
			fmt.Fprintf(w, "  unavailable: %s\n", d.Error)
			continue
		}
		fmt.Fprintf(w, "  device:        %s\n", d.Name)
		fmt.Fprintf(w, "  memory:        %s\n", formatSize(int64(d.MemoryBytes)))
		if d.SIMDWidth > 0 {
			fmt.Fprintf(w, "  SIMD width:    %d floats\n", d.SIMDWidth)
		} else {
			fmt.Fprintf(w, "  subgroup size: %d\n", d.SubgroupSize)
		}
		if d.Features != "" {
			fmt.Fprintf(w, "  features:      %s\n", d.Features)
		}
		fmt.Fprintf(w, "  threads:       %d\n", d.Threads)
		fmt.Fprintf(w, "  capabilities:  %s\n", strings.Join(d.Caps, " "))
		fmt.Fprintf(w, "  formats:       %s\n", strings.Join(d.Formats, " "))
	}
	return nil
}

func probeBackend(backend string, threads int) deviceReport {
	rep := deviceReport{Backend: backend}
	eng, info, err := openEngine(backend, threads)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	defer eng.Close()
	rep.Name, rep.MemoryBytes, rep.SubgroupSize = info.Name, info.MemoryBytes, info.SubgroupSize
	if backend == "cpu" { // a CPU has no subgroups; the field carries its SIMD width
		rep.SIMDWidth, rep.SubgroupSize = info.SubgroupSize, 0
	}
	rep.Features, rep.Threads = info.Features, info.Threads
	rep.Caps = capNames(info.Caps)
	for _, f := range info.Formats {
		rep.Formats = append(rep.Formats, f.String())
	}
	return rep
}
