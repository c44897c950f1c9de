package pgtemp

import (
	"context"
	"testing"
)

// Hooks for pgtemp_test; compiled only into the test binary.

func ProbeDocker(ctx context.Context, hosts []string) (string, error) { return probeDocker(ctx, hosts) }

func DockerCandidates() []string { return dockerCandidates() }

// SetBinGlob points the search for versioned Postgres directories at
// pattern for the rest of the test.
func SetBinGlob(tb testing.TB, pattern string) {
	old := binGlob
	binGlob = pattern
	tb.Cleanup(func() { binGlob = old })
}

func SortByVersionDesc(dirs []string) { sortByVersionDesc(dirs) }

// LocalDirAndPID returns the temp dir and postmaster pid of a server started
// from local binaries, or zero values for other servers.
func LocalDirAndPID(s *Server) (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.local == nil || s.local.child == nil {
		return "", 0
	}
	return s.local.dir, s.local.child.cmd.Process.Pid
}

func ProcessAlive(pid int) bool { return processAlive(pid) }

// RunMain is Main around run instead of m.Run.
func RunMain(run func() int) int { return runMain(run) }
