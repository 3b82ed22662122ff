// Package admin is the operator's side of the control service: API keys
// issued, read and revoked, and the live rules. It validates each operation
// and orchestrates the stores; the server only decodes and answers.
package admin

import (
	"context"
	"log/slog"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/audit"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/usage"
	"github.com/tollgate-rl/tollgate/shared/rules"
)

// KeyStore keeps API keys.
type KeyStore interface {
	Create(ctx context.Context, userID string, userIDNumber bool, tierID int, tier string, expiresAt time.Time) (raw string, rec apikeys.Record, err error)
	Lookup(ctx context.Context, raw string) (apikeys.Record, error)
	Get(ctx context.Context, id string) (apikeys.Record, error)
	Revoke(ctx context.Context, id string) (apikeys.Record, error)
	List(ctx context.Context, q apikeys.Query) ([]apikeys.Record, int64, error)
}

// RuleStore keeps the rules and tiers managed at runtime.
type RuleStore interface {
	Load(ctx context.Context) (ruleset.Snapshot, []error, error)
	NextRuleID(ctx context.Context) (int64, error)
	// Changes are made against the version they were validated with and
	// fail with ruleset.ErrConflict when another change came first.
	PutRule(ctx context.Context, r ruleset.Rule, version int64) error
	DeleteRule(ctx context.Context, id string, version int64) error
	PutTier(ctx context.Context, t ruleset.Tier, version int64) error
}

// Trail is the audit trail.
type Trail interface {
	Append(ctx context.Context, evs ...audit.Event) error
	List(ctx context.Context, q audit.Query) ([]audit.Event, string, error)
}

// UsageReader reads what identities were admitted.
type UsageReader interface {
	Read(ctx context.Context, identity string, windowStart, now time.Time) (usage.Report, error)
}

// Service runs the operator's operations.
type Service struct {
	keys     KeyStore
	rules    RuleStore
	trail    Trail
	usage    UsageReader
	summary  *summary.Reader
	live     func() *policy.Policy
	validate func(before, after ruleset.Snapshot) error
	changed  func(context.Context)
	m        *metrics.Metrics
	log      *slog.Logger
	now      func() time.Time
}

// Deps are the service's collaborators.
type Deps struct {
	Keys  KeyStore
	Rules RuleStore
	Trail Trail
	Usage UsageReader
	// Summary reads the deployment's summary.
	Summary *summary.Reader
	// Policy returns the live policy (default tier, rules).
	Policy func() *policy.Policy
	// Validate reports whether after, a change to the stored runtime rules
	// and tiers before, can be decided with over the file's configuration.
	Validate func(before, after ruleset.Snapshot) error
	// Changed applies a stored change on this replica at once (the others
	// follow the announcement).
	Changed func(context.Context)
	Metrics *metrics.Metrics
	Log     *slog.Logger
	Now     func() time.Time
}

// New returns the admin service.
func New(d Deps) *Service {
	return &Service{keys: d.Keys, rules: d.Rules, trail: d.Trail, usage: d.Usage, summary: d.Summary, live: d.Policy, validate: d.Validate, changed: d.Changed, m: d.Metrics, log: d.Log, now: d.Now}
}

// RulesResponse is the live rule set.
type RulesResponse struct {
	Version     string        `json:"version"`
	Rules       []rules.Rule  `json:"rules"`
	Tiers       []policy.Tier `json:"tiers"`
	DefaultTier string        `json:"default_tier"`
}

// RuleSet returns the live rules and tiers, as the policy holds them.
func (s *Service) RuleSet() RulesResponse {
	p := s.live()
	return RulesResponse{Version: p.Version(), Rules: p.Matching(), Tiers: p.Tiers(), DefaultTier: p.DefaultTier()}
}
