// Package amqptest finds a RabbitMQ for tests, as internal/pgtemp finds a Postgres, in this
// order:
//
//  1. the broker named by the AMQP_URL environment variable (its failure is final: a named
//     broker that does not answer is a misconfiguration, not a reason to try another);
//  2. a broker running on this machine at amqp://guest:guest@127.0.0.1:5672/;
//  3. the installed rabbitmq-server (Debian's package: /usr/lib/rabbitmq/bin/rabbitmq-server),
//     started in a temporary directory with a node name, ports and directories of its own;
//  4. a rabbitmq container through testcontainers, when a Docker engine answers within a
//     second or two.
//
// When none works, the error names what was tried and what to install. Call [Main] (or [Stop])
// from TestMain, so that a broker it started is stopped when the tests are done.
//
//	func TestMain(m *testing.M) { os.Exit(amqptest.Main(m)) }
//
//	url := amqptest.URL(t)
package amqptest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Where a broker came from, for the test log.
const (
	localURL      = "amqp://guest:guest@127.0.0.1:5672/"
	installedPath = "/usr/lib/rabbitmq/bin/rabbitmq-server"
	image         = "rabbitmq:3.13-alpine"
)

var shared struct {
	once sync.Once
	url  string
	from string
	err  error
	stop func()
}

// URL returns the URL of a RabbitMQ for tb, finding or starting one on first use; tb fails, with
// what was tried, when there is none.
//
//	conn, err := amqp.Dial(amqptest.URL(t))
func URL(tb testing.TB) string {
	tb.Helper()
	find()
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	tb.Logf("amqptest: RabbitMQ from %s", shared.from)
	return shared.url
}

// ExampleURL is URL for a runnable example, which has no testing.TB: it panics, with what was
// tried, when there is no broker.
//
//	conn, err := amqp.Dial(amqptest.ExampleURL())
func ExampleURL() string {
	find()
	if shared.err != nil {
		panic(shared.err)
	}
	return shared.url
}

func find() {
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.url, shared.from, shared.stop, shared.err = Find(ctx)
	})
}

// Main runs the tests, then stops a broker that URL started. It returns the exit code.
//
//	func TestMain(m *testing.M) { os.Exit(amqptest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	Stop()
	return code
}

// Stop stops a broker that URL or ExampleURL started, for a TestMain that runs the tests some
// other way (idemtest.Main, say).
//
//	code := idemtest.Main(m)
//	amqptest.Stop()
//	os.Exit(code)
func Stop() {
	if shared.stop != nil {
		shared.stop()
		shared.stop = nil
	}
}

// Find finds or starts a broker, as the package doc says, and returns its URL, where it came
// from, and a function that stops it (nil for a broker it did not start).
//
//	url, from, stop, err := amqptest.Find(ctx)
func Find(ctx context.Context) (url, from string, stop func(), err error) {
	if u := os.Getenv("AMQP_URL"); u != "" {
		if err := ping(u); err != nil {
			return "", "", nil, fmt.Errorf("amqptest: AMQP_URL does not answer: %w", err)
		}
		return u, "AMQP_URL", nil, nil
	}
	var tried []string
	if err := ping(localURL); err == nil {
		return localURL, "the broker running at 127.0.0.1:5672", nil, nil
	} else {
		tried = append(tried, "AMQP_URL is not set", "127.0.0.1:5672: "+err.Error())
	}
	if u, stop, err := startInstalled(ctx); err == nil {
		return u, "the installed rabbitmq-server, started in a temporary directory", stop, nil
	} else {
		tried = append(tried, "installed rabbitmq-server: "+err.Error())
	}
	if u, stop, err := startContainer(ctx); err == nil {
		return u, "a testcontainers " + image + " container", stop, nil
	} else {
		tried = append(tried, "testcontainers: "+err.Error())
	}
	return "", "", nil, fmt.Errorf("amqptest: no RabbitMQ (%s); set AMQP_URL, or install Debian's rabbitmq-server package, or run a Docker engine",
		strings.Join(tried, "; "))
}

func ping(url string) error {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
	if err != nil {
		return err
	}
	return conn.Close()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartInstalled starts the installed rabbitmq-server in a temporary directory of its own, and
// returns its URL and a function that stops it and removes the directory.
//
//	url, stop, err := amqptest.StartInstalled(ctx)
func StartInstalled(ctx context.Context) (string, func(), error) { return startInstalled(ctx) }

func startInstalled(ctx context.Context) (string, func(), error) {
	if _, err := os.Stat(installedPath); err != nil {
		return "", nil, fmt.Errorf("%s: %w", installedPath, err)
	}
	dir, err := os.MkdirTemp("", "amqptest-")
	if err != nil {
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	dist, err := freePort()
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return "", nil, err
	}
	node := fmt.Sprintf("amqptest%d_%d@localhost", os.Getpid(), port)
	cmd := exec.Command(installedPath)
	// The server runs as this user, its data in dir, on ports of its own, so that it meets no
	// other broker of this machine; HOME holds its Erlang cookie.
	cmd.Env = append(os.Environ(), "HOME="+dir, "RABBITMQ_NODENAME="+node, "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", port), fmt.Sprintf("RABBITMQ_DIST_PORT=%d", dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"), "RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_GENERATED_CONFIG_DIR="+filepath.Join(dir, "config"), "RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"RABBITMQ_PLUGINS_EXPAND_DIR="+filepath.Join(dir, "plugins"))
	cmd.Dir = dir
	log, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		return "", nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	// A process group of its own, so that stopping it takes the Erlang VM the script starts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		_ = log.Close()
		_ = os.RemoveAll(dir)
	}
	url := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port)
	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := ping(url); err == nil {
			return url, stop, nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(filepath.Join(dir, "server.out"))
			stop()
			return "", nil, fmt.Errorf("it exited: %s", lastLines(string(out), 5))
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("it did not answer within 90s")
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// startContainer runs RabbitMQ in Docker through testcontainers, after a quick check that an
// engine answers: testcontainers itself can wait a long time for one that is not there.
func startContainer(ctx context.Context) (string, func(), error) {
	if err := dockerAnswers(); err != nil {
		return "", nil, err
	}
	ctr, err := testcontainers.Run(ctx, image, testcontainers.WithExposedPorts("5672/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("5672/tcp").WithStartupTimeout(2*time.Minute)))
	if err != nil {
		return "", nil, err
	}
	stop := func() { _ = testcontainers.TerminateContainer(ctr) }
	endpoint, err := ctr.PortEndpoint(ctx, "5672/tcp", "")
	if err != nil {
		stop()
		return "", nil, err
	}
	url := "amqp://guest:guest@" + endpoint + "/"
	for range 100 {
		if err := ping(url); err == nil {
			return url, stop, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	return "", nil, errors.New("the container did not answer AMQP")
}

// dockerAnswers checks for a Docker engine's socket within two seconds.
func dockerAnswers() error {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	network, addr := "tcp", strings.TrimPrefix(host, "tcp://")
	if strings.HasPrefix(host, "unix://") {
		network, addr = "unix", strings.TrimPrefix(host, "unix://")
	}
	conn, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		return fmt.Errorf("no Docker engine at %s: %w", host, err)
	}
	return conn.Close()
}
