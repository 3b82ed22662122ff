package app

import (
	"context"
	"fmt"
	"slices"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
)

// OnChange registers f to be called after the shared state (runtime rules,
// tiers, overrides) at version has been applied (tests await propagation
// with it). Call it before Serve.
func (a *App) OnChange(f func(version int64)) { a.onChange = f }

// compose lays the runtime rules and tiers over the file's, and validates
// the whole: what a replica decides with.
func compose(file *config.Config, snap ruleset.Snapshot) (*config.Config, error) {
	c := *file
	c.Rules = slices.Clone(file.Rules)
	for _, r := range snap.Rules {
		c.Rules = append(c.Rules, r.Rule)
	}
	c.Tiers = slices.Clone(file.Tiers)
	for _, t := range snap.Tiers {
		c.Tiers = append(c.Tiers, t.Tier)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// applyLocked compiles file and snap into the live policy. reloadMu is held.
func (a *App) applyLocked(file *config.Config, snap ruleset.Snapshot) error {
	cfg, err := compose(file, snap)
	if err != nil {
		return fmt.Errorf("runtime rules and tiers over the file: %w", err)
	}
	p, err := decision.Compile(cfg, a.nextVersion())
	if err != nil {
		return fmt.Errorf("compile config: %w", err)
	}
	a.file, a.runtime = file, snap
	a.svc.SetPolicy(p)
	return nil
}

// validateRuntime reports whether snap, laid over the live file config,
// could be decided with: the admin API refuses a change that would not.
func (a *App) validateRuntime(snap ruleset.Snapshot) error {
	a.reloadMu.Lock()
	file := a.file
	a.reloadMu.Unlock()
	_, err := compose(file, snap)
	return err
}

// refresh reloads the shared state when its version differs from the one
// applied (version -1: always). A replica that cannot read it keeps deciding
// with what it has.
func (a *App) refresh(ctx context.Context, version int64) {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if version >= 0 && (version == a.runtime.Version || version == a.refused) {
		return
	}
	snap, bad, err := a.ruleset.Load(ctx)
	if err != nil {
		a.log.Warn("runtime rules and tiers not reloaded; keeping the previous ones", "err", err)
		return
	}
	for _, e := range bad {
		a.log.Error("runtime state skipped or upgraded", "err", e)
	}
	if err := a.overrides.Refresh(ctx); err != nil {
		a.log.Warn("overrides not reloaded", "err", err)
	}
	if err := a.applyLocked(a.file, snap); err != nil {
		// Said once per version, not at every check.
		a.refused = snap.Version
		a.log.Error("runtime rules and tiers refused; keeping the previous policy", "version", snap.Version, "err", err)
		return
	}
	if a.onChange != nil {
		a.onChange(snap.Version)
	}
}
