package pgtemp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// dockerProbeTimeout bounds the whole Docker probe. testcontainers-go can
// wait a long time for an engine that is not there, so pgtemp asks first and
// moves on to the local binaries quickly when nobody answers.
const dockerProbeTimeout = 1500 * time.Millisecond

// dockerCandidates lists the Docker hosts to probe: DOCKER_HOST alone when
// set, otherwise the sockets testcontainers-go itself looks at (the default
// one, then rootless and Docker Desktop ones).
func dockerCandidates() []string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return []string{h}
	}
	hosts := []string{"unix:///var/run/docker.sock"}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		hosts = append(hosts, "unix://"+filepath.Join(dir, "docker.sock"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		hosts = append(hosts,
			"unix://"+filepath.Join(home, ".docker", "run", "docker.sock"),
			"unix://"+filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	hosts = append(hosts, "unix://"+filepath.Join("/run/user", strconv.Itoa(os.Getuid()), "docker.sock"))
	return dedupe(hosts)
}

func dedupe(xs []string) []string {
	seen := make(map[string]bool, len(xs))
	out := xs[:0]
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// probeDocker returns the first host whose engine answers GET /_ping, trying
// them in order within dockerProbeTimeout overall. Missing sockets fail at
// once, so the timeout only matters for a socket or port that accepts and
// then hangs.
func probeDocker(ctx context.Context, hosts []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dockerProbeTimeout)
	defer cancel()

	var failures []string
	for _, host := range hosts {
		err := pingDocker(ctx, host)
		if err == nil {
			return host, nil
		}
		failures = append(failures, fmt.Sprintf("%s (%v)", host, err))
	}
	return "", fmt.Errorf("no engine answered at %s", strings.Join(failures, ", "))
}

// pingDocker asks one Docker host for GET /_ping.
func pingDocker(ctx context.Context, host string) error {
	if err := ctx.Err(); err != nil {
		return errors.New("not tried: probe time is up")
	}
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("error parsing host: %w", err)
	}

	transport := &http.Transport{DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	var pingURL string
	switch u.Scheme {
	case "unix":
		var d net.Dialer
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", u.Path)
		}
		pingURL = "http://docker/_ping"
	case "tcp":
		scheme := "http"
		if os.Getenv("DOCKER_TLS_VERIFY") != "" || u.Port() == "2376" {
			scheme = "https"
			transport.TLSClientConfig = dockerTLSConfig()
		}
		pingURL = scheme + "://" + u.Host + "/_ping"
	default:
		return fmt.Errorf("scheme %q is not probed; only unix:// and tcp:// are", u.Scheme)
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pingURL, nil)
	if err != nil {
		return fmt.Errorf("error building ping request: %w", err)
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("no answer within %v", dockerProbeTimeout)
		}
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ping answered %s", resp.Status)
	}
	return nil
}

// dockerTLSConfig presents the client certificate from DOCKER_CERT_PATH (the
// engine may require one) but does not verify the server: the probe only
// asks whether an engine is there, and testcontainers-go makes the real,
// verified connection afterwards.
func dockerTLSConfig() *tls.Config {
	cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // Probe only; see above.
	dir := os.Getenv("DOCKER_CERT_PATH")
	if dir == "" {
		if home, err := os.UserHomeDir(); err == nil {
			dir = filepath.Join(home, ".docker")
		}
	}
	if cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")); err == nil {
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// ContainerStarter starts a throwaway Postgres in a container on the Docker engine at host (as
// the probe found it), with settings as postgres -c arguments, and returns its URL (postgres://),
// what it is (for the test log) and how to stop it. A module of its own provides it
// (github.com/idemkit/idem/idemtest/pgdocker), so that Docker's client modules stay out of the
// go.mod of every module that only imports idemtest.
type ContainerStarter func(ctx context.Context, host string, settings []string) (rawURL, detail string, stop func() error, err error)

// PgdockerPath is the package that provides the container source, to name in messages.
const PgdockerPath = "github.com/idemkit/idem/idemtest/pgdocker"

var containers atomic.Pointer[ContainerStarter]

// RegisterContainers makes Start try a Docker engine, through start, after TEST_DATABASE_URL and
// before the local binaries. pgdocker calls it when it is imported.
//
//	func init() { pgtemp.RegisterContainers(startContainer) }
func RegisterContainers(start ContainerStarter) { containers.Store(&start) }

// startContainer starts Postgres in a container on the engine at host, with the registered
// starter and the test-friendly settings of the local binaries.
func startContainer(ctx context.Context, host string) (*Server, error) {
	start := containers.Load()
	if start == nil {
		return nil, fmt.Errorf("no container source is linked in (a test file with import _ %q uses it)", PgdockerPath)
	}
	raw, detail, stop, err := (*start)(ctx, host, serverSettings())
	if err != nil {
		return nil, err
	}
	u, err := parseURL(raw)
	if err != nil {
		_ = stop()
		return nil, err
	}
	srv := &Server{source: sourceContainer, url: u, detail: detail, stopContainer: stop}
	if err := srv.openAdmin(ctx); err != nil {
		_ = stop()
		return nil, err
	}
	return srv, nil
}
