package idemhttp

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestProblemTypesPointAtTheREADME: every problem's type URI, the default base and its name,
// must lead a reader somewhere: an anchor of that name in the repository's README, where the
// status table explains the problem. GitHub serves README.md at the base's path.
func TestProblemTypesPointAtTheREADME(t *testing.T) {
	t.Parallel()
	const readmeURL = "https://github.com/idemkit/idem/blob/main/README.md#"
	require.Equal(t, readmeURL, DefaultProblemTypeBase)
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`<a id="([^"]+)"></a>`).FindAllStringSubmatch(string(readme), -1) {
		anchors[m[1]] = true
	}
	require.NotEmpty(t, problemKinds)
	for _, k := range problemKinds {
		require.True(t, anchors[k.name], "README.md has no anchor <a id=%q></a> for problem %s", k.name, k.name)
		// The anchor sits in the row that documents the problem's status.
		row := regexp.MustCompile(`(?m)^\|[^\n]*<a id="` + regexp.QuoteMeta(k.name) + `"></a>[^\n]*$`).FindString(string(readme))
		require.Contains(t, row, strconv.Itoa(k.status), "the README row of %s names its status", k.name)
	}
}

// TestREADMEFingerprintClaim: the README's promise that equivalent JSON has one fingerprint holds
// only for JSON content types (DefaultFingerprint canonicalises nothing else), and says so.
func TestREADMEFingerprintClaim(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(readme)), " ")
	i := strings.Index(text, "Equivalent JSON bodies")
	require.GreaterOrEqual(t, i, 0, "the README states what equivalent JSON bodies get")
	claim := text[i:min(len(text), i+400)]
	for _, s := range []string{"Content-Type", "application/json", "+json", "byte for byte"} {
		require.Contains(t, claim, s, "the claim names the condition it holds under")
	}
	// And the code keeps to it.
	require.True(t, isJSON("application/json") && isJSON("application/merge-patch+json"))
	require.False(t, isJSON("text/plain"))
}
