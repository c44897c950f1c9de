package idemui_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemui"
	"github.com/idemkit/idem/steps"
	"github.com/idemkit/idem/workflow"
)

var greet = workflow.Define("greet", func(ctx context.Context, name string) (string, error) {
	return steps.Tx(ctx, "greet", func(ctx context.Context, tx pgx.Tx) (string, error) { return "hello " + name, nil }, nil)
})

// The view mounted under a prefix, behind the application's own check of who may look.
func ExampleNewHandler() {
	ctx := context.Background()
	pool := idemtest.NewExamplePool(nil)
	defer pool.Close()
	engine, err := workflow.NewEngine(pool, &workflow.Config{Workflows: []workflow.Definition{greet}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()
	if _, err := greet.Run(ctx, engine, idem.Key{Scope: "team:ops", ID: "hello-1"}, "world", nil); err != nil {
		log.Fatal(err)
	}

	ui, err := idemui.NewHandler(engine, &idemui.Options{Prefix: "/ops/idem"})
	if err != nil {
		log.Fatal(err)
	}
	operatorsOnly := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Role") != "operator" { // the application's own authentication
				http.Error(w, "forbidden", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/idem/", operatorsOnly(ui))

	req := httptest.NewRequest(http.MethodGet, "/ops/idem/runs?workflow=greet", nil)
	req.Header.Set("X-Role", "operator")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), "hello-1"), strings.Contains(rec.Body.String(), "read-only"))
	// Output: 200 true true
}
