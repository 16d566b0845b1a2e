package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"gonum.org/v1/plot/vg/vgimg"

	"github.com/gokv/gokv/gokv"
)

// checkOutputPath fails before any work is done when the command could not write its output file at
// path: an empty path, a missing or unwritable directory, or a directory in the file's place.
func checkOutputPath(flag, path string) error {
	if path == "" {
		return fmt.Errorf("%s is empty: give the path of the file to write", flag)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s is a directory, not a file", flag, path)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s %s: directory %s does not exist", flag, path, dir)
	case err != nil:
		return fmt.Errorf("%s %s: %w", flag, path, err)
	case !st.IsDir():
		return fmt.Errorf("%s %s: %s is not a directory", flag, path, dir)
	}
	probe, err := os.CreateTemp(dir, ".gokv-write-check-*")
	if err != nil {
		return fmt.Errorf("%s %s: cannot write in directory %s: %w", flag, path, dir, errors.Unwrap(err))
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// writePNG writes a drawn canvas as a PNG file; flag names the option that chose path.
func writePNG(flag, path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return nil
}

// openEngine opens the --backend with --threads workers and the CLI's logger, and describes its device.
func openEngine(backend string, threads int) (*gokv.Engine, gokv.DeviceInfo, error) {
	eng, err := gokv.Open(gokv.WithBackend(backend), gokv.WithThreads(threads), gokv.WithLogger(logger))
	if err != nil {
		return nil, gokv.DeviceInfo{}, fmt.Errorf("--backend %s: %w", backend, err)
	}
	info, err := eng.Info()
	if err != nil {
		eng.Close()
		return nil, gokv.DeviceInfo{}, err
	}
	return eng, info, nil
}
