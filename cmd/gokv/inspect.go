package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gokv/gokv/gokv"
)

type inspectOpts struct {
	json bool
}

// inspectReport is what `gokv inspect --json` prints.
type inspectReport struct {
	File        string            `json:"file"`
	FileBytes   int64             `json:"file_bytes"`
	HeaderBytes int64             `json:"header_bytes"`
	Version     int               `json:"version"`
	Model       string            `json:"model"`
	SinkTokens  int               `json:"sink_tokens"`
	Layers      []inspectLayer    `json:"layers"`
	PageSize    int               `json:"page_size"`
	Policy      string            `json:"policy"`
	Groups      []inspectGroup    `json:"groups"`
	Sequences   []inspectSequence `json:"sequences"`
	Tensors     []inspectTensor   `json:"tensors"`
	Verified    bool              `json:"verified"`        // every checksum matched and the state is consistent
	Error       string            `json:"error,omitempty"` // what is wrong when not
}

type inspectLayer struct {
	Layer  string `json:"layer"`  // e.g. "GQA 32q/8kv d128"
	Format string `json:"format"` // canonical, e.g. "q4:32"
	Group  int    `json:"group"`
}

type inspectGroup struct {
	Layers []int `json:"layers"`
	Window int   `json:"window"` // 0: full attention
	Sinks  int   `json:"sinks"`
	Pages  int   `json:"pages"` // pages saved, each once
}

type inspectSequence struct {
	Length   int   `json:"length"`
	Pages    []int `json:"pages"`    // per layer group: pages held
	Released []int `json:"released"` // per layer group: entries released by eviction
	Shift    []int `json:"shift"`    // per layer group: positions removed by compaction
	Hidden   []int `json:"hidden"`   // per layer: hidden tokens over its kv heads
}

type inspectTensor struct {
	Name     string  `json:"name"`
	DType    string  `json:"dtype"`
	Shape    []int64 `json:"shape"`
	Bytes    int64   `json:"bytes"`
	CRC32C   string  `json:"crc32c"`
	Verified bool    `json:"verified"`
}

func newInspectCmd(_ *globalOpts) *cobra.Command {
	o := &inspectOpts{}
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "What a saved cache (Cache.Save) holds, with its checksums verified; no device needed",
		Long: `inspect reads a file written by gokv's Cache.Save and prints what it holds: the format version, the
model, each layer's format, the page size, the eviction policy, the layer groups with the pages saved, every
sequence's length and pages, and each tensor's size and checksum. It verifies every checksum (reading one
tensor at a time) and the state's consistency, as a load would, and fails when something is wrong, after
printing what it could read. It opens no device.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd.OutOrStdout(), args[0], o)
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

// runInspect describes the file at path; a file whose checksums fail is described and then reported.
func runInspect(w io.Writer, path string, o *inspectOpts) error {
	sc, err := gokv.InspectSavedCache(path)
	if sc == nil {
		return err
	}
	rep := inspectReportOf(path, sc)
	rep.Verified = err == nil
	if err != nil {
		rep.Error = err.Error()
	}
	if o.json {
		if jerr := writeJSON(w, rep); jerr != nil {
			return jerr
		}
		return err
	}
	printInspect(w, rep)
	return err
}

func inspectReportOf(path string, sc *gokv.SavedCache) inspectReport {
	rep := inspectReport{File: path, FileBytes: sc.FileBytes, HeaderBytes: sc.HeaderBytes, Version: sc.Version,
		Model: sc.Model.Name, SinkTokens: sc.Model.SinkTokens, PageSize: sc.PageSize, Policy: sc.Policy}
	for _, g := range sc.Groups {
		rep.Groups = append(rep.Groups, inspectGroup{Layers: g.Layers, Window: g.Window, Sinks: g.Sinks, Pages: g.Pages})
	}
	for l, ls := range sc.Model.Layers {
		g := -1
		for gi, grp := range sc.Groups {
			for _, x := range grp.Layers {
				if x == l {
					g = gi
				}
			}
		}
		rep.Layers = append(rep.Layers, inspectLayer{Layer: ls.String(), Format: sc.Formats[l].String(), Group: g})
	}
	for _, s := range sc.Sequences {
		rep.Sequences = append(rep.Sequences, inspectSequence{Length: s.Length, Pages: s.Pages, Released: s.Released,
			Shift: s.Shift, Hidden: s.Hidden})
	}
	for _, t := range sc.Tensors {
		rep.Tensors = append(rep.Tensors, inspectTensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Bytes: t.Bytes,
			CRC32C: t.Checksum, Verified: t.Verified})
	}
	return rep
}

func printInspect(w io.Writer, r inspectReport) {
	fmt.Fprintf(w, "%s: gokv saved cache, format version %d, %s (header %s)\n", r.File, r.Version, formatSize(r.FileBytes), formatSize(r.HeaderBytes))
	fmt.Fprintf(w, "model %q: %d layers, %d sink tokens; page size %d; policy %s\n", r.Model, len(r.Layers), r.SinkTokens, r.PageSize, r.Policy)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "layer\tattention\tformat\tgroup")
	for l, x := range r.Layers {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\n", l, x.Layer, x.Format, x.Group)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "group\tlayers\twindow\tsinks\tpages saved")
	for gi, g := range r.Groups {
		window := "full"
		if g.Window > 0 {
			window = fmt.Sprint(g.Window)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\n", gi, joinInts(g.Layers), window, g.Sinks, g.Pages)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%d sequences\n", len(r.Sequences))
	if len(r.Sequences) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "sequence\ttokens\tpages per group\treleased\tcompacted away\thidden per layer")
		for i, s := range r.Sequences {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", i, s.Length, joinInts(s.Pages), joinInts(s.Released), joinInts(s.Shift), joinInts(s.Hidden))
		}
		tw.Flush()
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "tensor\tdtype\tshape\tbytes\tcrc32c\t")
	bad := 0
	for _, t := range r.Tensors {
		status := "ok"
		if !t.Verified {
			status, bad = "MISMATCH", bad+1
		}
		shape := make([]string, len(t.Shape))
		for i, x := range t.Shape {
			shape[i] = fmt.Sprint(x)
		}
		fmt.Fprintf(tw, "%s\t%s\t[%s]\t%d\t%s\t%s\n", t.Name, t.DType, strings.Join(shape, " "), t.Bytes, t.CRC32C, status)
	}
	tw.Flush()
	switch {
	case r.Verified:
		fmt.Fprintf(w, "\nchecksums: the state and all %d tensors verified\n", len(r.Tensors))
	case bad > 0:
		fmt.Fprintf(w, "\nchecksums: %d of %d tensors do not match: the file is corrupted\n", bad, len(r.Tensors))
	default:
		fmt.Fprintf(w, "\nchecksums verified, but: %s\n", r.Error)
	}
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}
