package workflowtest_test

import (
	"os"
	"testing"

	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) { os.Exit(idemtest.Main(m)) }
