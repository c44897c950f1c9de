//go:build !linux

package pgtemp

import "syscall"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal: a server outlives a test binary that dies without Close, until it
// is stopped by hand.
func setParentDeathSignal(*syscall.SysProcAttr, syscall.Signal) {}

// memoryTempDir finds no memory-backed directory outside Linux; the data
// goes to os.TempDir.
func memoryTempDir(uint64) (string, bool) { return "", false }
