package idemcli

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/workflow"
)

// The web view, served on its own for operators who do not mount idemui in their application.

type uiFlags struct {
	listen, basicAuth string
	allowActions      bool
}

var uiCmd = &command{
	name:    "ui",
	summary: "Serve the web view of runs, keys and schedules (package idemui) until interrupted.",
	help: "Read-only unless --allow-actions, which turns on cancel, resume, fork, key delete and\n" +
		"schedule pause, resume and trigger (each confirmed, CSRF-protected and logged on stderr\n" +
		"with the basic-auth user). --basic-auth user:pass asks every request for that user and\n" +
		"password; --allow-actions on an address other than loopback requires it.",
	flags: func(fs *flag.FlagSet, c *call) {
		fs.StringVar(&c.ui.listen, "listen", "127.0.0.1:8081", "address to serve on")
		fs.StringVar(&c.ui.basicAuth, "basic-auth", "", "require HTTP basic authentication as `user:pass`")
		fs.BoolVar(&c.ui.allowActions, "allow-actions", false, "allow actions that change runs, keys and schedules")
		riverFlags(fs, c)
	},
	run: func(ctx context.Context, c *call) error {
		user, pass, hasAuth := strings.Cut(c.ui.basicAuth, ":")
		if c.ui.basicAuth != "" && (!hasAuth || user == "" || pass == "") {
			return usagef("--basic-auth must be user:pass, both non-empty")
		}
		host, _, err := net.SplitHostPort(c.ui.listen)
		if err != nil {
			return usagef("--listen %q is not host:port: %v", c.ui.listen, err)
		}
		if ip := net.ParseIP(host); c.ui.allowActions && c.ui.basicAuth == "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return usagef("--allow-actions on %s, which other machines may reach, needs --basic-auth user:pass", c.ui.listen)
		}
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return c.withEngine(ctx, c.ui.allowActions, func(e *workflow.Engine) error {
			h, err := idemui.NewHandler(e, &idemui.Options{AllowActions: c.ui.allowActions, Schema: c.schema,
				Logger: slog.New(slog.NewTextHandler(c.stderr, nil))})
			if err != nil {
				return err
			}
			var handler http.Handler = h
			if c.ui.basicAuth != "" {
				handler = requireBasicAuth(user, pass, h)
			}
			ln, err := net.Listen("tcp", c.ui.listen)
			if err != nil {
				return fmt.Errorf("error listening: %w", err)
			}
			srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
			mode := "read-only"
			if c.ui.allowActions {
				mode = "actions on"
			}
			fmt.Fprintf(c.stdout, "serving idem's view on http://%s/ (%s); stop with Ctrl-C\n", ln.Addr(), mode)
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			select {
			case err := <-done:
				return fmt.Errorf("error serving: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("error stopping: %w", err)
			}
			return nil
		})
	},
}

// requireBasicAuth answers 401 to a request without the user and password.
func requireBasicAuth(user, pass string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user))&subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="idem", charset="UTF-8"`)
			http.Error(w, "idem ui: this view asks for a user and password (--basic-auth)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
