package workflow

import (
	"context"
	"runtime/debug"
	"slices"

	"github.com/idemkit/idem/internal/redact"
)

// UnknownVersion is Config.Version's default when the binary carries no VCS revision (a test
// binary, a build outside a repository, or one made with -buildvcs=false): set Version yourself
// there, from your release process, if ResumeVersions or RunList's version filter is to tell
// deploys apart.
//
//	cfg := &workflow.Config{Version: os.Getenv("RELEASE")} // "" falls back to the VCS revision, then UnknownVersion
const UnknownVersion = "unknown"

// buildVersion is the default of Config.Version: the VCS revision the binary was built from
// (with "-dirty" when the work tree had changes), else the main module's version when it is a
// released one, else UnknownVersion.
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return UnknownVersion
	}
	var revision, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	switch {
	case revision != "" && modified == "true":
		return revision + "-dirty"
	case revision != "":
		return revision
	case info.Main.Version != "" && info.Main.Version != "(devel)":
		return info.Main.Version
	}
	return UnknownVersion
}

// resumes reports whether this engine takes up runs started by code of version: every version
// without Config.ResumeVersions; the listed ones (and its own) with it. A run stored before
// versions were recorded ("") is anyone's.
func (e *Engine) resumes(version string) bool {
	return len(e.cfg.ResumeVersions) == 0 || version == "" || slices.Contains(e.cfg.ResumeVersions, version)
}

// leaveToVersion logs that this engine leaves a run to an engine of the run's version.
func (e *Engine) leaveToVersion(ctx context.Context, workflow, scope, id, version, by string) {
	e.log.InfoContext(ctx, "workflow: leaving run to an engine of its version", "workflow", workflow, "scope", scope, e.keys.Log(redact.Key{Scope: scope, ID: id}),
		"run_version", version, "engine_version", e.cfg.Version, "resume_versions", e.cfg.ResumeVersions, "by", by)
}
