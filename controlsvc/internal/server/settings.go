package server

import (
	"crypto/sha256"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/config"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// settings are what the server reads of the configuration in force.
type settings struct {
	maxBodyBytes int64
	failureMode  string
	adminTokens  []config.AdminToken
	// headers are the X-RateLimit fields a decision's answer carries,
	// named with header_prefix.
	headers wire.HeaderSet
	// decisionDigests are the SHA-256 of the decision tokens, computed once
	// per configuration: the decision route compares against them on every
	// request.
	decisionDigests [][sha256.Size]byte
}

// SetConfig swaps in the settings of a configuration (start, reload).
func (s *Server) SetConfig(cfg *config.Config) {
	st := &settings{maxBodyBytes: cfg.MaxBodyBytes, failureMode: cfg.FailureMode, adminTokens: cfg.AdminTokens(),
		headers: wire.HeaderSet{XRateLimit: true, Strategy: true}.WithPrefix(cfg.HeaderPrefix)}
	for _, t := range cfg.DecisionTokens() {
		st.decisionDigests = append(st.decisionDigests, sha256.Sum256([]byte(t)))
	}
	s.set.Store(st)
}
