package readme

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSnippetsCompile type-checks every ```go block of README.md, so that a snippet a reader
// copies compiles against the code as it is.
//
// How a snippet is checked: it is put in a file of package readme after the imports and the
// declarations below (prelude). A snippet that is a list of top-level declarations is checked
// as such; any other snippet (statements, as most are) is checked as the body of a function.
// "declared and not used" is allowed, since a snippet often ends where the reader takes over.
// Errors are reported at README.md's line numbers.
//
// Adding a snippet: write it as the reader will use it. For each name it uses without
// declaring (the reader's pool, request, handler...), add a declaration to prelude, with the
// type the reader would have; for a package it uses, add the package to imports. A block
// that is not Go to compile (pseudo-code, or output) can be marked by putting the HTML comment
// <!-- readme: no-compile --> on the line before it, but prefer a block that compiles.
func TestSnippetsCompile(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets := goBlocks(readme)
	if len(snippets) < 4 {
		t.Fatalf("found %d ```go blocks in README.md; the extraction is broken", len(snippets))
	}
	imp := newImporter(t)
	for _, s := range snippets {
		t.Run(fmt.Sprintf("line%d", s.line), func(t *testing.T) {
			t.Parallel()
			if s.skip {
				t.Logf("README.md:%d is marked no-compile", s.line)
				return
			}
			for _, err := range typeCheck(s, imp) {
				t.Error(err)
			}
		})
	}
}

// TestTypeCheckFails makes sure the check can fail: a broken snippet must be reported at its
// README line.
func TestTypeCheckFails(t *testing.T) {
	t.Parallel()
	imp := newImporter(t)
	for _, src := range []string{
		"err := tx.Run(ctx, pool, 42)",
		"idem.Fingerprint(\"a\", 1)",
		"func f() { undefinedThing() }",
	} {
		errs := typeCheck(snippet{line: 100, src: src + "\n"}, imp)
		if len(errs) == 0 {
			t.Errorf("%q type-checked; it must not", src)
			continue
		}
		if !strings.Contains(errs[0].Error(), "README.md:100") {
			t.Errorf("%q: the error does not point at the README line: %v", src, errs[0])
		}
	}
	if errs := typeCheck(snippet{line: 1, src: "mw, err := idemhttp.Middleware(pool, nil)\n"}, imp); len(errs) != 0 {
		t.Errorf("an unused variable must be allowed: %v", errs)
	}
}

// imports are the packages every snippet may use.
var imports = []string{
	"context", "errors", "fmt", "log", "net/http", "strconv", "time",
	"github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool",
	"github.com/riverqueue/river", "github.com/riverqueue/river/riverdriver/riverpgxv5",
	"github.com/idemkit/idem", "github.com/idemkit/idem/idemhttp", "github.com/idemkit/idem/tx",
	"github.com/idemkit/idem/workflow", "github.com/idemkit/idem/steps", "github.com/idemkit/idem/idemriver",
	"github.com/idemkit/idem/outbox",
	"github.com/idemkit/idem/workflow/workflowtest", "github.com/idemkit/idem/idemcli", "os", "testing",
	"github.com/idemkit/idem/idemui",
	// Modules of their own, reached through go.work.
	"github.com/idemkit/idem/idemgrpc", "google.golang.org/grpc",
	"github.com/idemkit/idem/outbox/natspub", "github.com/nats-io/nats.go/jetstream",
}

// prelude declares what the README's snippets use without declaring: the reader's own code.
const prelude = `
var (
	ctx  context.Context
	pool *pgxpool.Pool
	mux  *http.ServeMux
	r    *http.Request

	pay  http.Handler

	// A web view: your own check in front of it.
	requireOperator func(http.Handler) http.Handler

	// idem.Do in fifteen lines, and Workflows
	customerID string
	req        PayoutReq

	// Workflows
	engine     *workflow.Engine
	merchantID string
	requestKey string
	psp        interface {
		Charge(ctx context.Context, key string, amount int64) (Charge, error)
	}
	Payout *workflow.Workflow[PayoutReq, Receipt]

	// gRPC
	authenticate grpc.UnaryServerInterceptor

	// Outbox
	body     []byte
	js       jetstream.JetStream
	consumer jetstream.Consumer
	// Changing workflows, Testing workflows
	Reminder      *workflow.Workflow[PayoutReq, Receipt]
	checkFraud    func(ctx context.Context, key string) (bool, error)
	chargeCard    func(ctx context.Context, key string) (Charge, error)
	appWorkflows  []workflow.Definition
)

type (
	Receipt    struct{ LedgerID int64 }
	PayoutReq  struct{ ID, From, To string; Amount int64 } // a transfer's request, or a payout's
	Hold       struct{ Amount int64 }
	Charge     struct{ ID string }
	NotifyArgs struct{ ID string }
)

func (NotifyArgs) Kind() string { return "notify" }

func userID(ctx context.Context) string                                  { return "" }
func transfer(ctx context.Context, t pgx.Tx, req any) (Receipt, error)   { return Receipt{}, nil }
func respond(receipt Receipt, err error)                                 {}
func createOrder(w http.ResponseWriter, r *http.Request)                 {}
func reserve(ctx context.Context, t pgx.Tx, req PayoutReq) (Hold, error) { return Hold{}, nil }
func settle(ctx context.Context, t pgx.Tx, h Hold, c Charge) (Receipt, error) {
	return Receipt{}, nil
}
`

type snippet struct {
	line int // of the first line of code in README.md
	src  string
	skip bool
}

var noCompile = regexp.MustCompile(`^<!--\s*readme:\s*no-compile\b.*-->\s*$`)

// goBlocks returns the ```go blocks of a Markdown document.
func goBlocks(md []byte) []snippet {
	var (
		out  []snippet
		cur  *snippet
		prev string
		body strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.TrimSpace(line) == "```go":
			cur = &snippet{line: n + 1, skip: noCompile.MatchString(strings.TrimSpace(prev))}
			body.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.src = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line + "\n")
		}
		prev = line
	}
	return out
}

// typeCheck checks one snippet and returns its errors, "declared and not used" aside.
func typeCheck(s snippet, newImp func() types.Importer) []error {
	var head strings.Builder
	head.WriteString("package readme\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&head, "\t%q\n", p)
	}
	head.WriteString(")\n")
	// Every import is used once, so that a snippet need not use them all.
	for _, p := range imports {
		fmt.Fprintf(&head, "var _ = %s.%s\n", filepath.Base(strings.TrimSuffix(p, "/v5")), anyExport[p])
	}
	head.WriteString(prelude)

	fset := token.NewFileSet()
	var src string
	if _, err := parser.ParseFile(fset, "", "package readme\n"+s.src, 0); err == nil {
		src = fmt.Sprintf("%s\n//line README.md:%d\n%s", head.String(), s.line, s.src)
	} else {
		src = fmt.Sprintf("%s\nfunc _() {\n//line README.md:%d\n%s}\n", head.String(), s.line, s.src)
	}
	f, err := parser.ParseFile(fset, "snippet.go", src, parser.SkipObjectResolution)
	if err != nil {
		return []error{err}
	}
	var errs []error
	conf := types.Config{
		Importer: newImp(),
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) && te.Soft && strings.Contains(te.Msg, "declared and not used") {
				return
			}
			errs = append(errs, err)
		},
	}
	_, _ = conf.Check("readme", fset, []*ast.File{f}, nil)
	return errs
}

// anyExport names one exported identifier of each import, for the blank use of it.
var anyExport = map[string]string{
	"context": "Background", "errors": "New", "fmt": "Sprint", "log": "Print", "net/http": "StatusOK",
	"strconv": "Itoa", "time": "Second",
	"github.com/jackc/pgx/v5": "ReadCommitted", "github.com/jackc/pgx/v5/pgxpool": "New",
	"github.com/riverqueue/river": "QueueDefault", "github.com/riverqueue/river/riverdriver/riverpgxv5": "New",
	"github.com/idemkit/idem": "ErrInFlight", "github.com/idemkit/idem/idemhttp": "Tx",
	"github.com/idemkit/idem/tx": "Run", "github.com/idemkit/idem/workflow": "ErrFailed", "github.com/idemkit/idem/idemriver": "Migrate",
	"github.com/idemkit/idem/idemgrpc": "Tx", "google.golang.org/grpc": "NewServer",
	"github.com/idemkit/idem/outbox": "Append", "github.com/idemkit/idem/outbox/natspub": "New",
	"github.com/nats-io/nats.go/jetstream": "New",
	"github.com/idemkit/idem/steps":        "Permanent", "github.com/idemkit/idem/workflow/workflowtest": "New",
	"github.com/idemkit/idem/idemcli": "Main", "os": "Exit", "testing": "Short",
	"github.com/idemkit/idem/idemui": "NewHandler",
}

// newImporter reads the packages' export data, which go list builds (and caches) for it. An
// importer is not safe for concurrent use, so each check makes its own from the function.
func newImporter(t *testing.T) func() types.Importer {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}={{.Export}}"}, imports...)
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	exports := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if path, file, ok := strings.Cut(line, "="); ok && file != "" {
			exports[path] = file
		}
	}
	return func() types.Importer {
		return importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok {
				return nil, fmt.Errorf("no export data for %s: add it to imports in readme_test.go", path)
			}
			return os.Open(file)
		})
	}
}
