package limiter

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/shared/breaker"
)

// Concurrent checks share round trips: each script call waits in a queue,
// and a flusher takes what is queued (up to maxBatch calls) and sends it as
// one pipeline of EVALSHAs. Nothing waits for a batch to fill: an idle
// limiter sends each call at once, a busy one sends what queued up while
// the previous pipeline was in flight. One flusher (a node) makes fuller
// pipelines than two (measured: Redis CPU per decision 13-14 -> 12-13 µs,
// the service's about 1 µs less); Redis runs scripts one at a time anyway.
// A flusher that finds only
// its first call yields once first: the handlers that are runnable at that
// moment queue theirs, and the pipeline carries them (measured: Redis CPU
// per decision 19 -> 16 µs, the service's 29 -> 25 µs, latency lower), at
// the price of one scheduler pass for a lone call. Every call keeps its own
// result and error, its own NOSCRIPT fallback, and Redis runs the scripts in
// queue order, each atomically, as it would one by one.
//
// A pipeline runs under no deadline of its own: the client's read and write
// timeouts (redisconn sets them from the service's Redis timeout) bound
// every round trip, and a context with a timer per pipeline cost 8 of a
// check's allocations for nothing more.
//
// On a cluster each node has its own queue and flusher, a call going to
// its first key's node: with one pipeline for all nodes, every batch
// waited for the slowest node's part, and one hung master (SIGSTOP: it
// keeps its connections and answers nothing) held every check of every
// caller for seconds while the breaker, fed that node's timeouts between
// the others' successes, never opened (attack 48: 24 checks answered in 4
// s where 1,500 were asked). Calls queued one after another for one key
// still run in that order.
const maxBatch = 64

type call struct {
	s    *script
	argv []any // the EVALSHA command (script.evalSha)
	// tries counts the answers that its slot was moving (tryAgain).
	tries int
	// v and err are the answer, written before done is signalled. done
	// is buffered, so a flusher never waits on a caller; it carries no
	// value, so it is one allocation (a channel of pointers is two).
	v    any
	err  error
	done chan struct{}
}

type batcher struct {
	rdb Client
	// node names the cluster node a key's slot is on (nil for one Redis).
	node func(ctx context.Context, key string) string
	// one is the queue of a single Redis, and of calls a cluster's slot
	// map has no node for yet.
	one    *queue
	mu     sync.Mutex
	queues map[string]*queue // a cluster's, by node address
	stop   chan struct{}
	wg     sync.WaitGroup
}

// queue is one node's calls and, on a cluster, the node's own breaker: a
// pipeline it left unanswered (a timeout, a dead connection: no reply at
// all, not an error reply) stops its calls for nodeCooldown, answered at
// once with ErrNodeDown, then one call probes. One, not two in a row: the
// second pipeline to a frozen node waited out the client's redial, and
// the node's callers were held up to 2.1 s before the failure mode
// (attack 50 A2); a stall longer than the Redis timeout costs the node's
// callers a second of the failure mode instead. Waiting out the Redis
// timeout on every call of a hung node, its callers took up to 3.2 s a
// check (the client redialling and handshaking with a node that accepts
// and never answers). The service's breaker does not count a node's
// failures (NodeLocal): on a cluster one node says nothing of the others.
type queue struct {
	ch   chan *call
	name string
	down *breaker.Breaker // nil for a single Redis
}

// ErrNodeDown is the answer to a call of a cluster node that is not
// answering.
var ErrNodeDown = errors.New("redis cluster node not answering")

// nodeDownAfter unanswered pipelines in a row stop a cluster node's calls
// for nodeCooldown.
const (
	nodeDownAfter = 1
	nodeCooldown  = time.Second
)

// ErrNodeFailing wraps an error reply of one cluster node that is no
// script's own (scriptError): OOM (a full shard), BUSY (a long script),
// NOREPLICAS (min-replicas-to-write with a replica down), LOADING, MISCONF,
// READONLY, and CLUSTERDOWN from a master rejoining after a restart while
// the others answer. Counted by the breaker in front of all of Redis, five
// in a row from one master of three put every caller of every master in
// the failure mode for as long as that master's trouble lasted (attack 52
// F1: 287 of 1,388 checks of healthy masters' callers refused under
// fail_closed, twice the limit admitted under fail_open). A cluster-wide
// condition (CLUSTERDOWN from every node during a failover) answers every
// node's calls at once with their own error replies: each caller takes the
// failure mode without a breaker to stop the calls.
var ErrNodeFailing = errors.New("redis cluster node failing")

// NodeLocal says err is about one cluster node (a slot moving, a node not
// answering or answering with an error): a breaker in front of all of
// Redis must not count it.
func NodeLocal(err error) bool {
	return SlotMoving(err) || errors.Is(err, ErrNodeDown) || errors.Is(err, ErrNodeFailing)
}

// SaysNothing says a call's outcome is no finding about Redis at all: the
// caller went away, or the limiter refused the request, or a script failed
// on its own data.
func SaysNothing(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, ErrBadRequest) || errors.Is(err, ErrScript)
}

// Tell records on b, a breaker in front of all of Redis, what a call's
// outcome (not SaysNothing) says of Redis, and reports whether b opened or
// closed. One cluster node's trouble (NodeLocal) says nothing of the
// others: counted, a 0.9 s slot move answered 679 of 2,654 other callers'
// checks degraded (attack 47 A1), and a hung master every caller's
// (attack 48); nor does it close b when the call was b's probe, and the
// next call probes at once (attack 49: a probe on a frozen master's queue
// held every caller degraded 1.2 s after the cluster was back).
func Tell(b *breaker.Breaker, err error, now int64) (changed bool) {
	if NodeLocal(err) {
		b.Retry(now)
		return false
	}
	return b.Record(err == nil, now)
}

func newBatcher(rdb Client) *batcher {
	b := &batcher{rdb: rdb, queues: map[string]*queue{}, stop: make(chan struct{})}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		b.node = func(ctx context.Context, key string) string {
			n, err := cc.MasterForKey(ctx, key)
			if err != nil {
				return ""
			}
			return n.Options().Addr
		}
	}
	b.queueFor("")
	b.one = b.queues[""]
	return b
}

// queueFor returns a node's queue, starting its flusher the first time
// (nil once the batcher is closed).
func (b *batcher) queueFor(node string) chan *call {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q, ok := b.queues[node]; ok {
		return q.ch
	}
	select {
	case <-b.stop:
		return nil
	default:
	}
	q := &queue{ch: make(chan *call, 4*maxBatch), name: node}
	if node != "" {
		q.down = breaker.New(nodeDownAfter, int64(nodeCooldown))
	}
	b.queues[node] = q
	b.wg.Add(1)
	go b.flusher(q)
	return q.ch
}

// retire drops q from the map of queues: the next call for its node
// starts a new one.
func (b *batcher) retire(q *queue) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.queues[q.name] == q {
		delete(b.queues, q.name)
	}
}

// refuse answers calls of a node that is not answering.
func (q *queue) refuse(calls []*call) {
	for _, c := range calls {
		c.answer(nil, fmt.Errorf("%w: %s", ErrNodeDown, q.name))
	}
}

// route is the queue of a call: its first key's node's.
func (b *batcher) route(ctx context.Context, argv []any) chan *call {
	if b.node == nil {
		return b.one.ch
	}
	if n, _ := argv[2].(int); n < 1 {
		return b.one.ch
	}
	key, _ := argv[3].(string)
	return b.queueFor(b.node(ctx, key))
}

// run queues one script call and waits for its answer or ctx.
func (b *batcher) run(ctx context.Context, s *script, argv []any) (any, error) {
	c, err := b.enqueue(ctx, s, argv)
	if err != nil {
		return nil, err
	}
	return c.wait(ctx)
}

// enqueue queues one script call. Calls queued one after another run in
// Redis in that order.
func (b *batcher) enqueue(ctx context.Context, s *script, argv []any) (*call, error) {
	c := &call{s: s, argv: argv, done: make(chan struct{}, 1)}
	select {
	case b.route(ctx, argv) <- c:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.stop:
		return nil, redis.ErrClosed
	}
}

// wait waits for a queued call's answer or ctx.
func (c *call) wait(ctx context.Context) (any, error) {
	select {
	case <-c.done:
		return c.v, c.err
	case <-ctx.Done():
		// The call may still run in Redis, as a call cancelled in flight
		// may: its answer is dropped.
		return nil, ctx.Err()
	}
}

// A cluster node's queue that has had no call for nodeIdle is retired:
// nodes come and go by address (a replaced pod, a failover to a new
// host), and each queue kept a flusher, its channel and its breaker for
// the life of the process. A caller may have taken a queue's channel just
// before it was dropped from the map, so its flusher serves what still
// comes for nodeLinger before it returns (the call goes to its key's node
// whichever queue carries it: the cluster client routes each command).
var (
	nodeIdle   = 10 * time.Minute
	nodeLinger = time.Minute
)

func (b *batcher) flusher(q *queue) {
	defer b.wg.Done()
	batch := make([]*call, 0, maxBatch)
	var idle <-chan time.Time // nil for a single Redis: never retired
	var idleTimer *time.Timer
	if q.name != "" {
		idleTimer = time.NewTimer(nodeIdle)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	var retired <-chan time.Time
	for {
		select {
		case <-b.stop:
			return
		case <-retired:
			return
		case <-idle:
			idle = nil
			b.retire(q)
			retired = time.After(nodeLinger)
			continue
		case c := <-q.ch:
			batch = append(batch[:0], c)
		}
		if idle != nil {
			idleTimer.Reset(nodeIdle)
		}
		if len(q.ch) == 0 {
			runtime.Gosched() // see the comment at the top
		}
	drain:
		for len(batch) < maxBatch {
			select {
			case c := <-q.ch:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		if q.down == nil {
			b.send(batch, nil)
			continue
		}
		ok, probe := q.down.Admit(time.Now().UnixNano())
		if !ok {
			q.refuse(batch)
			continue
		}
		if probe {
			// One call probes, off the flusher: the node's other calls are
			// refused at once meanwhile (the breaker holds them until the
			// probe is recorded), not queued behind it (a frozen node's
			// probe waits out the Redis timeout or the client's redial:
			// 220 ms to 1.9 s; attack 50 A1).
			q.refuse(batch[1:])
			one := []*call{batch[0]}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				q.down.Record(b.send(one, q), time.Now().UnixNano())
			}()
			continue
		}
		q.down.Record(b.send(batch, q), time.Now().UnixNano())
	}
}

// send runs a batch as one pipeline and answers each call; it reports
// whether the node answered at all (a reply, an error reply included).
// With a cluster node's queue (q), calls the node left unanswered are
// answered with ErrNodeDown wrapped around their error, and its other
// errors but a script's own and a slot's move with ErrNodeFailing.
func (b *batcher) send(batch []*call, q *queue) (answered bool) {
	ctx := context.Background()
	vs, errs := make([]any, len(batch)), make([]error, len(batch))
	if len(batch) == 1 {
		vs[0], errs[0] = batch[0].s.run(ctx, b.rdb, batch[0].argv)
	} else {
		cmds := make([]*redis.Cmd, len(batch))
		_, _ = b.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range batch {
				cmds[i] = redis.NewCmd(ctx, c.argv...)
				_ = p.Process(ctx, once{cmds[i]})
			}
			return nil
		})
		for i, c := range batch {
			vs[i], errs[i] = cmds[i].Result()
			if noScript(errs[i]) {
				// Redis lost the script (a restart, SCRIPT FLUSH): EVAL
				// loads it and runs this call again, as a lone call would.
				vs[i], errs[i] = c.s.eval(ctx, b.rdb, c.argv)
			}
		}
	}
	for _, err := range errs {
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			answered = true
		}
	}
	for i, c := range batch {
		err := errs[i]
		switch {
		case err == nil || q == nil || SlotMoving(err) || scriptError(err):
		case !answered:
			err = fmt.Errorf("%w (%s): %w", ErrNodeDown, q.name, err)
		default:
			err = fmt.Errorf("%w (%s): %w", ErrNodeFailing, q.name, err)
		}
		if !b.tryAgain(c, err) {
			c.answer(vs[i], err)
		}
	}
	return answered
}

// A cluster node moving a slot (resharding) answers TRYAGAIN to a script
// whose keys it does not all hold: from MIGRATING until the slot is handed
// over, a script naming a key that does not exist (a caller's penalty
// record, mostly) runs on neither node. And while the nodes learn of the
// handover one after another, a call can meet more MOVED answers than the
// client follows. Neither ran the script; it runs again after a pause,
// doubling from tryAgainPause, up to maxTryAgain times (0.66 s in all: a
// slot of a few thousand keys moving), not from the flusher, which serves
// every other call meanwhile. Answered as errors, such checks took the
// failure mode: fail_open admitted a resharded caller without limit (273
// of 149 in TestClusterReshardUnderLoad) and the errors fed the breaker.
const (
	tryAgainPause = 2 * time.Millisecond
	maxTryAgain   = 10
)

// SlotMoving says err is a cluster's answer that the slot is moving: the
// command did not run, and the node that said so works (a circuit breaker
// in front of Redis must not count it: the other slots' callers would go
// to the failure mode with the moving slot's).
func SlotMoving(err error) bool {
	if err == nil {
		return false
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return moved || ask || redis.IsTryAgainError(err)
}

// tryAgain queues c again later if err says its slot is moving and c has
// tries left; false when c is to be answered now.
func (b *batcher) tryAgain(c *call, err error) bool {
	if !SlotMoving(err) || c.tries >= maxTryAgain {
		return false
	}
	pause := tryAgainPause << min(c.tries, 6)
	c.tries++
	time.AfterFunc(pause, func() {
		select {
		case b.route(context.Background(), c.argv) <- c:
		case <-b.stop:
			c.answer(nil, redis.ErrClosed)
		}
	})
	return true
}

// answer gives the call its result and wakes its caller; the flusher
// touches the call no more.
func (c *call) answer(v any, err error) {
	c.v, c.err = v, err
	c.done <- struct{}{}
}

func (b *batcher) close() {
	b.mu.Lock()
	close(b.stop) // under mu: no flusher starts after it
	b.mu.Unlock()
	b.wg.Wait()
}
