package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// binaries are the two programs pgtemp needs to run its own Postgres.
type binaries struct {
	dir      string // where initdb was found, for messages
	initdb   string
	postgres string
}

// binGlob is where Debian and Ubuntu install each Postgres major version.
// Tests point it elsewhere to force the "nothing found" path.
var binGlob = "/usr/lib/postgresql/*/bin"

// findBinaries looks for initdb and postgres on PATH, then in
// `pg_config --bindir`, then in the highest version matching binGlob. The
// error names every place it looked and why each did not do.
func findBinaries() (binaries, error) {
	var tried []string

	if initdb, err := exec.LookPath("initdb"); err == nil {
		// initdb runs the postgres next to it, so prefer that one.
		if b, ok := binariesIn(filepath.Dir(initdb)); ok {
			b.initdb = initdb
			return b, nil
		}
		if pg, err := exec.LookPath("postgres"); err == nil {
			return binaries{dir: filepath.Dir(initdb), initdb: initdb, postgres: pg}, nil
		}
		tried = append(tried, "PATH (initdb found but no postgres)")
	} else {
		tried = append(tried, "PATH")
	}

	if dir, err := pgConfigBindir(); err != nil {
		tried = append(tried, fmt.Sprintf("pg_config --bindir (%v)", err))
	} else if b, ok := binariesIn(dir); ok {
		return b, nil
	} else {
		tried = append(tried, fmt.Sprintf("pg_config --bindir (%s has no initdb and postgres)", dir))
	}

	dirs, _ := filepath.Glob(binGlob) // The pattern is constant and valid.
	sortByVersionDesc(dirs)
	for _, dir := range dirs {
		if b, ok := binariesIn(dir); ok {
			return b, nil
		}
	}
	if len(dirs) == 0 {
		tried = append(tried, binGlob+" (no match)")
	} else {
		tried = append(tried, binGlob+" (no initdb and postgres in "+strings.Join(dirs, ", ")+")")
	}

	return binaries{}, fmt.Errorf("initdb and postgres not found on %s", strings.Join(tried, ", "))
}

// binariesIn returns dir's initdb and postgres if both are executable files.
func binariesIn(dir string) (binaries, bool) {
	b := binaries{dir: dir, initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
	return b, isExecutable(b.initdb) && isExecutable(b.postgres)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

func pgConfigBindir() (string, error) {
	pgConfig, err := exec.LookPath("pg_config")
	if err != nil {
		return "", errors.New("pg_config not found on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, pgConfig, "--bindir").Output()
	if err != nil {
		return "", fmt.Errorf("error running pg_config: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// sortByVersionDesc orders directories like /usr/lib/postgresql/16/bin by
// the version in their parent's name, highest first, so 16 beats 9.6.
func sortByVersionDesc(dirs []string) {
	version := func(dir string) []int {
		var v []int
		for _, part := range strings.Split(filepath.Base(filepath.Dir(dir)), ".") {
			n, err := strconv.Atoi(part)
			if err != nil {
				return nil
			}
			v = append(v, n)
		}
		return v
	}
	slices.SortStableFunc(dirs, func(a, b string) int {
		return slices.Compare(version(b), version(a))
	})
}
