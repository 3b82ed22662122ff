// Package redisconn turns TOLLGATE_REDIS_URL into one redis.UniversalClient,
// whatever the topology behind it.
package redisconn

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Topology is the shape of the Redis deployment.
type Topology string

const (
	Single   Topology = "single"
	Sentinel Topology = "sentinel"
	Cluster  Topology = "cluster"
)

// Options is a parsed URL.
type Options struct {
	Topology  Topology
	Universal redis.UniversalOptions
}

// Parse reads a Redis URL:
//
//	redis://[user:pass@]host:port[/db]              single server
//	rediss://...                                    single server over TLS
//	redis-sentinel://[user:pass@]h1:p1,h2:p2[/db]?master=NAME[&sentinel_password=...]
//	redis-cluster://[user:pass@]h1:p1,h2:p2
//
// "+tls" may be appended to the sentinel and cluster schemes.
func Parse(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, fmt.Errorf("redis url: %w", redactErr(err))
	}
	scheme, useTLS := strings.CutSuffix(u.Scheme, "+tls")
	var o Options
	switch scheme {
	case "redis", "rediss":
		o.Topology = Single
		useTLS = useTLS || scheme == "rediss"
	case "redis-sentinel":
		o.Topology = Sentinel
	case "redis-cluster":
		o.Topology = Cluster
	default:
		return Options{}, fmt.Errorf("redis url: unknown scheme %q (want redis, rediss, redis-sentinel or redis-cluster)", u.Scheme)
	}
	if u.Host == "" {
		return Options{}, fmt.Errorf("redis url: no host")
	}
	for _, h := range strings.Split(u.Host, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return Options{}, fmt.Errorf("redis url: %q must be host:port", h)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return Options{}, fmt.Errorf("redis url: bad port in %q", h)
		}
		o.Universal.Addrs = append(o.Universal.Addrs, h)
	}
	if o.Topology == Single && len(o.Universal.Addrs) != 1 {
		return Options{}, fmt.Errorf("redis url: a single server takes one host; use redis-cluster:// or redis-sentinel:// for several")
	}
	if u.User != nil {
		o.Universal.Username = u.User.Username()
		o.Universal.Password, _ = u.User.Password()
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return Options{}, fmt.Errorf("redis url: database %q must be a number", db)
		}
		if o.Topology == Cluster && n != 0 {
			return Options{}, fmt.Errorf("redis url: a cluster has only database 0")
		}
		o.Universal.DB = n
	}
	q := u.Query()
	switch o.Topology {
	case Sentinel:
		o.Universal.MasterName = q.Get("master")
		if o.Universal.MasterName == "" {
			return Options{}, fmt.Errorf("redis url: redis-sentinel needs ?master=NAME")
		}
		o.Universal.SentinelUsername = q.Get("sentinel_username")
		o.Universal.SentinelPassword = q.Get("sentinel_password")
		q.Del("master")
		q.Del("sentinel_username")
		q.Del("sentinel_password")
	case Cluster:
		o.Universal.IsClusterMode = true
	}
	for k := range q {
		return Options{}, fmt.Errorf("redis url: unknown parameter %q", k)
	}
	if useTLS {
		host, _, _ := net.SplitHostPort(o.Universal.Addrs[0])
		o.Universal.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return o, nil
}

// New parses the URL and builds a client with the given per-call timeout and
// pool size. It does not connect.
func New(raw string, timeout time.Duration, poolSize int) (redis.UniversalClient, Topology, error) {
	o, err := Parse(raw)
	if err != nil {
		return nil, "", err
	}
	u := o.Universal
	u.DialTimeout = max(timeout, 500*time.Millisecond)
	u.ReadTimeout = timeout
	u.WriteTimeout = timeout
	u.PoolTimeout = timeout
	u.PoolSize = poolSize
	// A retry doubles the wait of a caller whose Redis is gone; the failure
	// mode answers faster than a retry would.
	u.MaxRetries = 1
	u.DialerRetries = 1
	u.ContextTimeoutEnabled = true
	if o.Topology == Cluster {
		c := u.Cluster()
		// The client learns the slot map from CLUSTER SLOTS when a node
		// answers MOVED, or every reload interval (go-redis: 60 s). A
		// master that dies answers nothing: until the next reload the keys
		// of its slots go to it, and fail, though its replica was promoted
		// within the node timeout. Reloading every second bounds that
		// (measured by make reliability: a master killed under load).
		c.ClusterStateReloadInterval = clusterReload
		return redis.NewClusterClient(c), o.Topology, nil
	}
	return redis.NewUniversalClient(&u), o.Topology, nil
}

// clusterReload is how often a cluster client reloads the slot map.
const clusterReload = time.Second

var setLogger sync.Once

// SetLogger sends go-redis's own log lines (dial failures, sentinel changes)
// to log at debug level instead of stderr. go-redis keeps one logger per
// process, so the first call wins.
func SetLogger(log *slog.Logger) {
	setLogger.Do(func() { redis.SetLogger(slogAdapter{log}) })
}

type slogAdapter struct{ log *slog.Logger }

func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	a.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// redactErr keeps a password out of url.Parse errors, which quote the URL.
func redactErr(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return fmt.Errorf("%s: %v", ue.Op, ue.Err)
	}
	return err
}
