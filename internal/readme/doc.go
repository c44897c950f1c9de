// Package readme holds the test that keeps the Go snippets of the repository's README.md
// compiling; it has no code of its own.
package readme
