package decision

import (
	"time"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/limiter"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/policy"
)

// Settings are the service settings a decision reads beside the policy.
type Settings struct {
	Lease config.Lease
	// Penalty is nil when progressive penalties are off.
	Penalty *limiter.Penalty
	// MaxAdhocLimit bounds a limit a check or an override names itself.
	MaxAdhocLimit int64
	FailureMode   string
	MaxBatch      int
	// Disabled admits every check as exempt without counting (enabled =
	// false).
	Disabled bool
	// Shadow answers every denial as a log-only pass (shadow_mode).
	Shadow bool
	// ThrottleMaxWait bounds how long a throttle rule delays a request.
	ThrottleMaxWait time.Duration
	// RetryAfterJitter is the largest share a refusal's wait is lengthened
	// by, at random (retry_after_jitter).
	RetryAfterJitter float64
}

// SettingsOf takes the decision's settings from a loaded configuration.
func SettingsOf(cfg *config.Config) Settings {
	s := Settings{Lease: cfg.Lease, MaxAdhocLimit: cfg.MaxAdhocLimit, FailureMode: cfg.FailureMode, MaxBatch: cfg.MaxBatch, Disabled: !cfg.Enabled, Shadow: cfg.ShadowMode,
		ThrottleMaxWait: time.Duration(cfg.ThrottleMaxWaitMs) * time.Millisecond, RetryAfterJitter: cfg.RetryAfterJitter}
	if pc := cfg.Penalties; pc.Enabled {
		s.Penalty = &limiter.Penalty{
			Window:      time.Duration(pc.DetectionWindowSeconds) * time.Second,
			Threshold:   pc.ViolationThreshold,
			Multipliers: pc.Multipliers,
		}
	}
	return s
}

// view is what one decision reads: a policy and the settings in force with
// it, swapped in together.
type view struct {
	*policy.Policy
	Settings
}
