package admin

import (
	"context"
	"errors"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/apierr"
	"github.com/tollgate-rl/tollgate/controlsvc/internal/store/summary"
)

// Summary is the deployment's summary over a window (5m, 1h, 24h; default
// 5m), from what every replica wrote: seed 001's RateLimitMetrics with a
// series and the most refused callers.
func (s *Service) Summary(ctx context.Context, window string) (summary.View, error) {
	if window == "" {
		window = "5m"
	}
	v, err := s.summary.Read(ctx, window, s.now())
	switch {
	case errors.Is(err, summary.ErrWindow):
		return summary.View{}, apierr.Invalid("window", err.Error())
	case err != nil:
		s.m.RedisErrors.WithLabelValues("summary").Inc()
		return summary.View{}, apierr.Unavailable("could not read the summary", err)
	}
	return v, nil
}
