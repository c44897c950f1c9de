package pgtemp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// readyTimeout bounds how long a fresh or restarted server may take to
	// accept connections.
	readyTimeout = 30 * time.Second
	// bindAttempts is how many free ports startLocal tries: another process
	// can take the port between our probe and postgres binding it.
	bindAttempts = 5
	// markerFile marks a temp dir as pgtemp's, so the stale-dir sweep never
	// removes anything else.
	markerFile = "pgtemp-owned"
)

// serverSettings are the postgres settings for tests, shared by the local
// binaries and the container. Durability is off because the data is thrown
// away; PGTEMP_FSYNC=on keeps it for benchmarks that want real I/O costs.
func serverSettings() []string {
	settings := []string{
		"max_connections=400",
		"shared_buffers=128MB",
		"max_locks_per_transaction=256",
	}
	if os.Getenv("PGTEMP_FSYNC") != "on" {
		settings = append(settings, "fsync=off", "full_page_writes=off")
	}
	return settings
}

// localServer is a postgres that pgtemp started from the local binaries as
// its own child process.
type localServer struct {
	bins    binaries
	dir     string // temp root: socket, log, and data/
	dataDir string
	logPath string
	port    int
	cred    *syscall.Credential // non-nil when running as root

	child *child // nil while stopped
}

// child is a running process and the result of waiting for it.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait has returned
	err  error         // cmd.Wait's result; read only after done is closed
}

func startLocal(ctx context.Context) (*Server, error) {
	bins, err := findBinaries()
	if err != nil {
		return nil, err
	}
	l, err := initLocal(ctx, bins)
	if err != nil {
		return nil, err
	}
	if err := l.startOnFreePort(ctx); err != nil {
		_ = os.RemoveAll(l.dir)
		return nil, err
	}
	postgres := bins.postgres
	if real, err := filepath.EvalSymlinks(postgres); err == nil {
		postgres = real
	}
	srv := &Server{source: sourceLocal, url: l.url(), detail: postgres + " in " + l.dir, local: l}
	if err := srv.openAdmin(ctx); err != nil {
		_ = l.close()
		return nil, err
	}
	return srv, nil
}

// initLocal makes the temp dir and runs initdb in it.
func initLocal(ctx context.Context, bins binaries) (*localServer, error) {
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	bases := tempBases(cred)
	sweepStaleOnce.Do(func() {
		for _, base := range bases {
			sweepStale(base)
		}
	})

	var dir string
	for _, base := range bases {
		dir, err = os.MkdirTemp(base, fmt.Sprintf("pgtemp-%d-*", os.Getpid()))
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("error making temp dir: %w", err)
	}
	l := &localServer{
		bins:    bins,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		cred:    cred,
	}
	if err := l.initdb(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return l, nil
}

func (l *localServer) initdb(ctx context.Context) error {
	if err := os.WriteFile(filepath.Join(l.dir, markerFile), nil, 0o600); err != nil {
		return fmt.Errorf("error writing marker file: %w", err)
	}
	if l.cred != nil {
		if err := os.Chown(l.dir, int(l.cred.Uid), int(l.cred.Gid)); err != nil {
			return fmt.Errorf("error giving temp dir to the postgres user: %w", err)
		}
	}

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, l.bins.initdb,
		"-D", l.dataDir,
		"-A", "trust", // Listens on 127.0.0.1 and a private socket dir only.
		"-U", "postgres",
		"-E", "UTF8",
		"--locale=C", // Deterministic sorting, whatever the machine's locale.
		"--no-sync",  // Throwaway data; fsync only costs time.
		"--no-instructions",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred, Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr, syscall.SIGKILL)
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("error starting initdb: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("error running initdb: %w: %s", err, lastLines(out.String(), 20))
	}
	return nil
}

// startOnFreePort starts postgres on a free port, trying another port when
// someone else binds it first.
func (l *localServer) startOnFreePort(ctx context.Context) error {
	var err error
	for range bindAttempts {
		l.port, err = freePort()
		if err != nil {
			return err
		}
		err = l.start(ctx)
		if !errors.Is(err, errPortInUse) {
			return err
		}
	}
	return fmt.Errorf("error starting postgres after %d ports: %w", bindAttempts, err)
}

var errPortInUse = errors.New("port already in use")

// restart stops postgres and starts it again on the same port, which URLs
// already handed out point to. The port is briefly unbound in between, so a
// lost race is retried for a few seconds before giving up.
func (l *localServer) restart(ctx context.Context) error {
	if err := l.stop(); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := l.start(ctx)
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// start runs postgres on l.port and waits until it accepts connections.
func (l *localServer) start(ctx context.Context) error {
	logFile, err := os.OpenFile(l.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("error opening postgres log: %w", err)
	}
	defer logFile.Close() // The child has its own copy.
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("error opening postgres log: %w", err)
	}

	args := []string{
		"-D", l.dataDir,
		"-p", strconv.Itoa(l.port),
		"-k", l.dir, // A private socket dir: no clash with a system server.
		"-c", "listen_addresses=127.0.0.1",
	}
	for _, kv := range serverSettings() {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(l.bins.postgres, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group keeps a terminal's Ctrl-C from stopping it
	// before the tests that use it have cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred, Setpgid: true}
	// SIGQUIT is Postgres's immediate shutdown: if this process dies
	// without Close, the server and its backends go with it.
	setParentDeathSignal(cmd.SysProcAttr, syscall.SIGQUIT)
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("error starting postgres: %w", err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	l.child = c

	if err := l.waitReady(ctx, logStart); err != nil {
		l.kill()
		return err
	}
	return nil
}

// waitReady connects until postgres answers, it exits, or readyTimeout
// passes; errors carry the tail of the server's log.
func (l *localServer) waitReady(ctx context.Context, logStart int64) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	connURL := l.url().String()
	var lastErr error
	for {
		select {
		case <-l.child.done:
			log := l.logSince(logStart)
			if strings.Contains(log, "could not bind") || strings.Contains(log, "Address already in use") {
				return fmt.Errorf("error starting postgres on port %d: %w", l.port, errPortInUse)
			}
			return fmt.Errorf("error starting postgres: it exited (%v); log:\n%s", l.child.err, lastLines(log, 20))
		default:
		}

		attemptCtx, attemptCancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attemptCtx, connURL)
		if err == nil {
			err = conn.Close(attemptCtx)
		}
		attemptCancel()
		if err == nil {
			return nil
		}
		lastErr = err

		select {
		case <-ctx.Done():
			return fmt.Errorf("error starting postgres: not ready after %v (%w; last connection error: %v); log:\n%s",
				readyTimeout, ctx.Err(), lastErr, lastLines(l.logSince(logStart), 20))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// stop asks for a fast shutdown (SIGINT: roll back, disconnect, exit) and
// escalates if postgres does not comply.
func (l *localServer) stop() error {
	c := l.child
	if c == nil {
		return nil
	}
	l.child = nil
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.done:
		return errors.New("postgres ignored fast shutdown for 15s and needed an immediate one")
	case <-time.After(5 * time.Second):
	}
	_ = c.cmd.Process.Kill()
	<-c.done
	return errors.New("postgres ignored fast and immediate shutdown and was killed")
}

// kill ends a server that failed to start, without ceremony.
func (l *localServer) kill() {
	if c := l.child; c != nil {
		l.child = nil
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}

func (l *localServer) close() error {
	stopErr := l.stop()
	if err := os.RemoveAll(l.dir); err != nil {
		return errors.Join(stopErr, fmt.Errorf("error removing temp dir: %w", err))
	}
	return stopErr
}

func (l *localServer) url() *url.URL {
	return &url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(l.port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
}

// logSince returns the server log written since offset, at most its last
// 64 KiB.
func (l *localServer) logSince(offset int64) string {
	f, err := os.Open(l.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > 64<<10 {
		offset = fi.Size() - 64<<10
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "(no log: " + err.Error() + ")"
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free port. It is free only for now; start
// notices if postgres loses the race for it.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("error finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// postgresCredential returns the postgres OS user's credential when running
// as root, because initdb and postgres refuse to run as root.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and postgres refuses root, but there is no postgres OS user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("error parsing the postgres user's uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("error parsing the postgres user's gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// minMemoryFree is how much room /dev/shm needs before pgtemp puts a
// server there: a fresh cluster takes about 40 MB and each database about
// 8 MB, and a container's default 64 MB /dev/shm must not be filled.
const minMemoryFree = 1 << 30

// tempBases lists where to make the temp dir, best first: memory, unless
// PGTEMP_FSYNC=on asks for real I/O, then os.TempDir.
func tempBases(cred *syscall.Credential) []string {
	var bases []string
	if os.Getenv("PGTEMP_FSYNC") != "on" {
		if dir, ok := memoryTempDir(minMemoryFree); ok {
			bases = append(bases, dir)
		}
	}
	base := os.TempDir()
	if cred != nil && !worldSearchable(base) {
		// The postgres user must reach its data dir; /tmp always allows that.
		base = "/tmp"
	}
	return append(bases, base)
}

func worldSearchable(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && fi.Mode().Perm()&0o001 != 0
}

var sweepStaleOnce sync.Once

// sweepStale removes temp dirs left by earlier test binaries that died
// without Close (a panic, a timeout, a kill). Their servers are already gone,
// killed by the parent-death signal; only the files remain. A dir is removed
// only when it carries our marker and neither its creator nor its postmaster
// is alive.
func sweepStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "pgtemp-*-*"))
	for _, dir := range dirs {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), "pgtemp-"), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, markerFile)); err != nil {
			continue
		}
		if pm, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(pm), "\n")
			if pmPid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && processAlive(pmPid) {
				continue
			}
		}
		_ = os.RemoveAll(dir)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
