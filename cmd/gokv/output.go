package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
