// Package changes tells replicas that the state operators manage (rules,
// tiers, overrides) changed: a version counter in Redis, bumped with every
// change, and a pub/sub announcement of the new version. A replica reloads
// on the announcement and compares the version on a timer, as a backstop for
// an announcement it missed.
package changes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/controlsvc/internal/keys"
)

// Announce tells every replica that the shared state changed to version v.
// Overrides announce through it too. It is best effort: the version was
// bumped with the change, and every replica compares it on a timer, so a
// lost announcement delays the change elsewhere by at most that period.
// Reported as a failure, it answered 503 to a change that was stored, and
// a client that retried created it twice (attack 53).
func Announce(ctx context.Context, rdb redis.UniversalClient, v int64) {
	_ = rdb.Publish(ctx, keys.AdminChanges, strconv.FormatInt(v, 10)).Err()
}

// Bump counts a change made elsewhere (an override) and announces it.
func Bump(ctx context.Context, rdb redis.UniversalClient) error {
	v, err := rdb.Incr(ctx, keys.AdminVersion).Result()
	if err != nil {
		return fmt.Errorf("count change: %w", err)
	}
	Announce(ctx, rdb, v)
	return nil
}

// Watcher follows the announcements of changes.
type Watcher struct {
	rdb redis.UniversalClient
	sub *redis.PubSub
}

// Subscribe starts listening for announcements and waits (up to timeout)
// until Redis confirms, so that no change announced after it returns is
// missed. A Redis that does not answer yet is not an error: the
// subscription connects when it can, and the version check covers the gap.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, timeout time.Duration, log *slog.Logger) *Watcher {
	sub := rdb.Subscribe(ctx, keys.AdminChanges)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := sub.Receive(wctx); err != nil {
		log.Warn("change announcements not confirmed yet; the version check covers them", "err", err)
	}
	return &Watcher{rdb: rdb, sub: sub}
}

// Run calls seen with the shared version at once, whenever a replica
// announces a change, and every `every` as a backstop for an announcement
// this replica missed (a dropped connection), until ctx ends. The caller
// compares the version with the one it applied.
func (w *Watcher) Run(ctx context.Context, every time.Duration, log *slog.Logger, seen func(version int64)) {
	defer w.sub.Close()
	msgs := w.sub.Channel()
	t := time.NewTicker(every)
	defer t.Stop()
	check := func() {
		v, err := w.rdb.Get(ctx, keys.AdminVersion).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() == nil {
				log.Warn("check the shared version", "err", err)
			}
			return
		}
		seen(v)
	}
	// Changes made between the caller's first load and the subscription.
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-msgs:
			if !ok {
				return
			}
			if v, err := strconv.ParseInt(m.Payload, 10, 64); err == nil {
				seen(v)
			}
		case <-t.C:
			check()
		}
	}
}
