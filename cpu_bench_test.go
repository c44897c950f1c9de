package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads the CPU time used so far by this process and by a Postgres server running on
// this machine (its postmaster and every backend). It reads nothing, and reports zero, when the
// server is elsewhere or /proc is not there.
type cpuMeter struct {
	postmaster int
	ticks      time.Duration // one clock tick, the unit of /proc/*/stat times
}

func newCPUMeter(ctx context.Context, pool *pgxpool.Pool) *cpuMeter {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return &cpuMeter{}
	}
	_, ppid, ok := procStat(backend)
	if !ok {
		return &cpuMeter{}
	}
	// USER_HZ is 100 on every Linux this runs on; sysconf is not reachable without cgo.
	return &cpuMeter{postmaster: ppid, ticks: 10 * time.Millisecond}
}

// split reads the CPU time of this process and of the server apart.
func (m *cpuMeter) split() (client, server time.Duration) {
	if m == nil || m.postmaster == 0 {
		return 0, 0
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if used, ppid, ok := procStat(pid); ok && (pid == m.postmaster || ppid == m.postmaster) {
			server += used * m.ticks
		}
	}
	return client, server
}

// procStat returns a process's utime+stime in clock ticks and its parent's pid.
func procStat(pid int) (ticks time.Duration, ppid int, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name may hold spaces; the fields after it are plain.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime + stime), ppid, true
}
