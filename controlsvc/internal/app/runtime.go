package app

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strconv"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
)

// OnChange registers f to be called after the shared state (runtime rules,
// tiers, overrides) at version has been applied (tests await propagation
// with it). Call it before Serve.
func (a *App) OnChange(f func(version int64)) { a.onChange = f }

// skipped is a runtime entry left out of what a replica decides with.
type skipped struct {
	entry string // "rule 12", "tier 3"
	value any    // the stored ruleset.Rule or ruleset.Tier
	err   error
}

// compose lays the runtime rules and tiers over the file's: what a replica
// decides with. A runtime entry that cannot be decided with beside the file
// and the entries before it (a rule naming a tier the file no longer has) is
// left out and returned in skips: one bad entry must not take every other
// runtime rule down. The file's configuration is valid on its own, so the
// result always is.
func compose(file *config.Config, snap ruleset.Snapshot) (*config.Config, []skipped) {
	all := *file
	all.Rules = slices.Clone(file.Rules)
	for _, r := range snap.Rules {
		all.Rules = append(all.Rules, r.Rule)
	}
	all.Tiers = slices.Clone(file.Tiers)
	for _, t := range snap.Tiers {
		all.Tiers = append(all.Tiers, t.Tier)
	}
	if all.Validate() == nil {
		return &all, nil
	}
	// Something does not fit: add the entries one at a time, tiers first
	// (rules name them), keeping each that leaves the whole valid. Only a
	// broken store pays for this.
	c := *file
	c.Rules, c.Tiers = slices.Clone(file.Rules), slices.Clone(file.Tiers)
	var skips []skipped
	for _, t := range snap.Tiers {
		c.Tiers = append(c.Tiers, t.Tier)
		if err := c.Validate(); err != nil {
			c.Tiers = c.Tiers[:len(c.Tiers)-1]
			skips = append(skips, skipped{entry: "tier " + strconv.Itoa(t.ID), value: t, err: err})
		}
	}
	for _, r := range snap.Rules {
		c.Rules = append(c.Rules, r.Rule)
		if err := c.Validate(); err != nil {
			c.Rules = c.Rules[:len(c.Rules)-1]
			skips = append(skips, skipped{entry: "rule " + r.ID, value: r, err: err})
		}
	}
	return &c, skips
}

// applyLocked compiles file and snap into the live policy. reloadMu is held.
func (a *App) applyLocked(file *config.Config, snap ruleset.Snapshot) error {
	cfg, skips := compose(file, snap)
	for _, s := range skips {
		a.log.Error("runtime entry left out: it cannot be decided with beside the config file; change or delete it", "entry", s.entry, "err", s.err)
	}
	p, err := decision.Compile(cfg, a.nextVersion())
	if err != nil {
		return fmt.Errorf("compile config: %w", err)
	}
	a.file, a.runtime = file, snap
	a.svc.SetPolicy(p)
	a.metrics.LeftOut.Set(float64(len(skips)))
	return nil
}

// validateRuntime reports whether after, a change to the runtime rules and
// tiers in before, can be decided with over the live file config: the admin
// API refuses a change that would leave an entry out. An entry already left
// out in before, and not touched, does not block other changes.
func (a *App) validateRuntime(before, after ruleset.Snapshot) error {
	a.reloadMu.Lock()
	file := a.file
	a.reloadMu.Unlock()
	_, now := compose(file, after)
	if len(now) == 0 {
		return nil
	}
	_, was := compose(file, before)
	for _, s := range now {
		if !slices.ContainsFunc(was, func(w skipped) bool { return w.entry == s.entry && reflect.DeepEqual(w.value, s.value) }) {
			return s.err
		}
	}
	return nil
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
