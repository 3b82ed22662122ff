package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// A cluster node's queue is retired once idle (nodes come and go by
// address: each kept a flusher and its breaker for the life of the
// process), and a call sent on its channel after it left the map is still
// answered. The "nodes" here are names a single Redis answers for all.
func TestIdleNodeQueuesRetire(t *testing.T) {
	idle, linger := nodeIdle, nodeLinger
	nodeIdle, nodeLinger = 30*time.Millisecond, 2*time.Second
	t.Cleanup(func() { nodeIdle, nodeLinger = idle, linger })

	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	b := newBatcher(rdb)
	t.Cleanup(b.close)
	b.node = func(_ context.Context, key string) string { return "node-" + key }
	s := newScript("return 7")
	ctx := context.Background()
	do := func(ch chan *call) {
		t.Helper()
		c := &call{s: s, argv: append(s.evalSha(1, 1), "a"), done: make(chan struct{}, 1)}
		if ch == nil {
			ch = b.route(ctx, c.argv)
		}
		ch <- c
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if v, err := c.wait(wctx); err != nil || v != int64(7) {
			t.Fatalf("answer %v %v", v, err)
		}
	}
	queued := func() *queue {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.queues["node-a"]
	}
	awaitRetired := func() {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); queued() != nil; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("an idle node's queue was not retired")
			}
		}
	}

	do(nil)
	first := queued()
	if first == nil {
		t.Fatal("no queue for node-a")
	}
	awaitRetired()
	// A caller that took the channel before the queue left the map.
	do(first.ch)
	// The next call for the node starts a new queue.
	do(nil)
	if q := queued(); q == nil || q == first {
		t.Fatalf("after retirement: queue %p, first %p", q, first)
	}
	awaitRetired()
	b.mu.Lock()
	one := b.queues[""]
	b.mu.Unlock()
	if one == nil || one != b.one {
		t.Fatal("the single Redis queue was retired")
	}
}
