package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/apikeys"
	"github.com/tollgate-rl/tollgate/shared/identity"
	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

type createKeyRequest struct {
	UserID    string    `json:"user_id"`
	Tier      string    `json:"tier"`
	ExpiresAt time.Time `json:"expires_at"`
}

type createKeyResponse struct {
	// APIKey is shown here once and never again.
	APIKey string `json:"api_key"`
	apikeys.Record
}

func (s *Server) createKey(c echo.Context) error {
	var req createKeyRequest
	if err := s.decode(c, &req, true); err != nil {
		return err
	}
	if _, err := identity.User(req.UserID); err != nil {
		return apierr.Invalid("user_id", "must be 1..255 printable characters")
	}
	tier := req.Tier
	if tier == "" {
		tier = s.svc.Policy().Config.DefaultTier
	}
	if !rules.ValidTierName(tier) {
		return apierr.Invalid("tier", "must match ^[a-z0-9_]+$")
	}
	if !req.ExpiresAt.IsZero() && !req.ExpiresAt.After(s.now()) {
		return apierr.Invalid("expires_at", "must be in the future")
	}
	raw, rec, err := s.keys.Create(c.Request().Context(), req.UserID, tier, req.ExpiresAt)
	if err != nil {
		s.m.RedisErrors.WithLabelValues("api_key").Inc()
		return apierr.Unavailable("could not store the key", err)
	}
	// The key id is logged, never the key.
	s.log.Info("api key created", "key_id", rec.ID, "user_id", rec.UserID, "tier", rec.Tier)
	return c.JSON(http.StatusCreated, createKeyResponse{APIKey: raw, Record: rec})
}

func (s *Server) getKey(c echo.Context) error {
	rec, err := s.keys.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return s.keyError(err)
	}
	return c.JSON(http.StatusOK, rec)
}

func (s *Server) revokeKey(c echo.Context) error {
	rec, err := s.keys.Revoke(c.Request().Context(), c.Param("id"))
	if err != nil {
		return s.keyError(err)
	}
	s.log.Info("api key revoked", "key_id", rec.ID)
	return c.JSON(http.StatusOK, rec)
}

func (s *Server) keyError(err error) error {
	if errors.Is(err, apikeys.ErrNotFound) {
		return apierr.New(http.StatusNotFound, wire.CodeNotFound, "no API key with that id")
	}
	s.m.RedisErrors.WithLabelValues("api_key").Inc()
	return apierr.Unavailable("could not read the key", err)
}
