package app

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// OnChange registers f to be called after the shared state (runtime rules,
// tiers, overrides) at version has been applied (tests await propagation
// with it). Call it before Serve.
func (a *App) OnChange(f func(version int64)) { a.onChange = f }

// compose lays the runtime rules and tiers of snap over the file's model:
// what a replica decides with. An entry that does not fit is left out and
// reported (policy.Compose).
func compose(file *config.Config, snap ruleset.Snapshot) (*policy.Spec, []policy.Skipped) {
	tiers := make([]policy.Tier, len(snap.Tiers))
	for i := range snap.Tiers {
		tiers[i] = snap.Tiers[i].Tier
		tiers[i].Runtime = true
	}
	rs := make([]rules.Rule, len(snap.Rules))
	for i := range snap.Rules {
		rs[i] = snap.Rules[i].Rule
		rs[i].Runtime = true
	}
	return policy.Compose(&file.Spec, tiers, rs)
}

// stored is the stored entry a skip names.
func stored(snap ruleset.Snapshot, s policy.Skipped) any {
	if s.IsTier {
		return snap.Tiers[s.Index]
	}
	return snap.Rules[s.Index]
}

// applyLocked compiles file and snap into the live policy. reloadMu is held.
func (a *App) applyLocked(file *config.Config, snap ruleset.Snapshot) error {
	spec, skips := compose(file, snap)
	for _, s := range skips {
		a.log.Error("runtime entry left out: it cannot be decided with beside the config file; change or delete it", "entry", s.Entry, "err", s.Err)
	}
	p, err := policy.Compile(spec, a.nextVersion())
	if err != nil {
		return fmt.Errorf("compile config: %w", err)
	}
	a.file, a.runtime = file, snap
	a.svc.SetPolicy(p, decision.SettingsOf(file))
	a.srv.SetConfig(file)
	a.rls.SetSettings(rlsSettings(file))
	a.local.SetReplicas(file.Replicas)
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
		if !slices.ContainsFunc(was, func(w policy.Skipped) bool {
			return w.Entry == s.Entry && reflect.DeepEqual(stored(before, w), stored(after, s))
		}) {
			return s.Err
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
