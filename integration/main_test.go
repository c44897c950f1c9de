package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idemkit/idem/internal/pgtemp"
)

// bankBinary is the examples/bank program, built once for all tests: they run it as a real
// process so that a SIGKILL is a real death.
var bankBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if err := buildBank(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return pgtemp.Main(m)
	}()
	os.Exit(code)
}

func buildBank(dir string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("integration: the go command is needed to build examples/bank: %w", err)
	}
	bankBinary = filepath.Join(dir, "bank")
	// Built without -race even under -race: the bank's own tests run it with the detector, and
	// here it has to restart quickly, dozens of times, on a small machine.
	cmd := exec.Command(goBin, "build", "-o", bankBinary, "github.com/idemkit/idem/examples/bank")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("integration: error building examples/bank: %w", err)
	}
	return nil
}
