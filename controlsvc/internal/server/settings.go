package server

import (
	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/credential"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// settings are what the server reads of the configuration in force.
type settings struct {
	maxBodyBytes int64
	failureMode  string
	inMemory     bool // redis_enabled = false
	adminTokens  []config.AdminToken
	// headers are the X-RateLimit fields a decision's answer carries,
	// named with header_prefix.
	headers wire.HeaderSet
	// decisionDigests are the SHA-256 of the decision tokens, computed once
	// per configuration: the decision route compares against them on every
	// request.
	decisionDigests credential.Digests
}

// SetConfig swaps in the settings of a configuration (start, reload).
func (s *Server) SetConfig(cfg *config.Config) {
	st := &settings{maxBodyBytes: cfg.MaxBodyBytes, failureMode: cfg.FailureMode, inMemory: !cfg.RedisEnabled, adminTokens: cfg.AdminTokens(),
		headers: wire.HeaderSet{XRateLimit: true, Strategy: true}.WithPrefix(cfg.HeaderPrefix), decisionDigests: credential.Of(cfg.DecisionTokens())}
	s.set.Store(st)
}
