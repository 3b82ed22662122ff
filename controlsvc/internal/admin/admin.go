// Package admin is the operator's side of the control service: API keys
// issued, read and revoked, and the live rules. It validates each operation
// and orchestrates the stores; the server only decodes and answers.
package admin

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/decision"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/metrics"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/apikeys"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/ruleset"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// KeyStore keeps API keys.
type KeyStore interface {
	Create(ctx context.Context, userID, tier string, expiresAt time.Time) (raw string, rec apikeys.Record, err error)
	Get(ctx context.Context, id string) (apikeys.Record, error)
	Revoke(ctx context.Context, id string) (apikeys.Record, error)
}

// RuleStore keeps the rules and tiers managed at runtime.
type RuleStore interface {
	Load(ctx context.Context) (ruleset.Snapshot, []error, error)
	NextRuleID(ctx context.Context) (int64, error)
	PutRule(ctx context.Context, r ruleset.Rule) error
	DeleteRule(ctx context.Context, id string) error
	PutTier(ctx context.Context, t ruleset.Tier) error
}

// Service runs the operator's operations.
type Service struct {
	keys     KeyStore
	rules    RuleStore
	policy   func() *decision.Policy
	validate func(ruleset.Snapshot) error
	changed  func(context.Context)
	m        *metrics.Metrics
	log      *slog.Logger
	now      func() time.Time
}

// Deps are the service's collaborators.
type Deps struct {
	Keys  KeyStore
	Rules RuleStore
	// Policy returns the live policy (default tier, rules).
	Policy func() *decision.Policy
	// Validate reports whether runtime rules and tiers, laid over the file's
	// configuration, could be decided with.
	Validate func(ruleset.Snapshot) error
	// Changed applies a stored change on this replica at once (the others
	// follow the announcement).
	Changed func(context.Context)
	Metrics *metrics.Metrics
	Log     *slog.Logger
	Now     func() time.Time
}

// New returns the admin service.
func New(d Deps) *Service {
	return &Service{keys: d.Keys, rules: d.Rules, policy: d.Policy, validate: d.Validate, changed: d.Changed, m: d.Metrics, log: d.Log, now: d.Now}
}

// CreateKeyRequest asks for a new API key.
type CreateKeyRequest struct {
	UserID    string    `json:"user_id"`
	Tier      string    `json:"tier"`
	ExpiresAt time.Time `json:"expires_at"`
}

// CreateKeyResponse carries the raw key: shown here once and never again.
type CreateKeyResponse struct {
	APIKey string `json:"api_key"`
	apikeys.Record
}

// CreateKey issues a key.
func (s *Service) CreateKey(ctx context.Context, req *CreateKeyRequest) (CreateKeyResponse, error) {
	if _, err := identity.User(req.UserID); err != nil {
		return CreateKeyResponse{}, apierr.Invalid("user_id", "must be 1..255 printable characters")
	}
	tier := req.Tier
	if tier == "" {
		tier = s.policy().Config.DefaultTier
	}
	if !rules.ValidTierName(tier) {
		return CreateKeyResponse{}, apierr.Invalid("tier", "must match ^[a-z0-9_]+$")
	}
	if !req.ExpiresAt.IsZero() && !req.ExpiresAt.After(s.now()) {
		return CreateKeyResponse{}, apierr.Invalid("expires_at", "must be in the future")
	}
	raw, rec, err := s.keys.Create(ctx, req.UserID, tier, req.ExpiresAt)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("api_key").Inc()
		return CreateKeyResponse{}, apierr.Unavailable("could not store the key", err)
	}
	// The key id is logged, never the key.
	s.log.Info("api key created", "key_id", rec.ID, "user_id", rec.UserID, "tier", rec.Tier)
	return CreateKeyResponse{APIKey: raw, Record: rec}, nil
}

// Key returns a key's record.
func (s *Service) Key(ctx context.Context, id string) (apikeys.Record, error) {
	rec, err := s.keys.Get(ctx, id)
	if err != nil {
		return apikeys.Record{}, s.keyError(err)
	}
	return rec, nil
}

// RevokeKey revokes a key; revoking twice keeps the first time.
func (s *Service) RevokeKey(ctx context.Context, id string) (apikeys.Record, error) {
	rec, err := s.keys.Revoke(ctx, id)
	if err != nil {
		return apikeys.Record{}, s.keyError(err)
	}
	s.log.Info("api key revoked", "key_id", rec.ID)
	return rec, nil
}

func (s *Service) keyError(err error) error {
	if errors.Is(err, apikeys.ErrNotFound) {
		return apierr.New(apierr.KindNotFound, wire.CodeNotFound, "no API key with that id")
	}
	s.m.RedisErrors.WithLabelValues("api_key").Inc()
	return apierr.Unavailable("could not read the key", err)
}

// RulesResponse is the live rule set.
type RulesResponse struct {
	Version     string        `json:"version"`
	Rules       []rules.Rule  `json:"rules"`
	Tiers       []config.Tier `json:"tiers"`
	DefaultTier string        `json:"default_tier"`
}

// RuleSet returns the live rules and tiers, as the policy holds them.
func (s *Service) RuleSet() RulesResponse {
	p := s.policy()
	return RulesResponse{Version: p.Rules.Version(), Rules: p.Rules.Rules(), Tiers: p.Config.Tiers, DefaultTier: p.Config.DefaultTier}
}
