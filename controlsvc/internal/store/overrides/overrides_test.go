package overrides

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/rules"
	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// afterHGetAll runs fn once, right after the first HGETALL's answer came
// back and before its caller reads it: a write landing between a
// refresh's read and its use.
type afterHGetAll struct {
	once sync.Once
	fn   func()
}

func (h *afterHGetAll) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *afterHGetAll) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "hgetall" {
			h.once.Do(h.fn)
		}
		return err
	}
}

func (h *afterHGetAll) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A refresh that read the hash before this replica's own delete does not
// bring the deleted override back (it did: the refresh its PUT's
// announcement started read the hash first and replaced memory after the
// delete, and a second DELETE found it again).
func TestRefreshOlderThanAWriteIsDropped(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	o := New(rdb)
	ov := Override{Limit: 2, WindowSeconds: 60, Algorithm: rules.FixedWindow, UpdatedAt: time.Unix(1, 0)}
	if err := o.Set(ctx, "user:u", "/x", ov); err != nil {
		t.Fatal(err)
	}
	rdb.AddHook(&afterHGetAll{fn: func() {
		if err := o.Delete(ctx, "user:u", "/x"); err != nil {
			t.Error(err)
		}
	}})
	if err := o.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := o.Get("user:u", "/x"); ok {
		t.Fatal("a refresh that read before the delete brought the override back")
	}
	if err := o.Refresh(ctx); err != nil { // the delete's own announcement
		t.Fatal(err)
	}
	if _, ok := o.Get("user:u", "/x"); ok {
		t.Fatal("the override is back after a later refresh")
	}
}
