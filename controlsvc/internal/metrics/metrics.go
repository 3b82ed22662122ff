// Package metrics defines the control service's Prometheus metrics on a
// registry of its own, so tests can read them and nothing global leaks in.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
)

// Decision results, the values of the "result" label.
const (
	Allowed  = "allowed"
	Denied   = "denied"
	Degraded = "degraded"
	Exempt   = "exempt"
	LogOnly  = "log_only"
	Disabled = "disabled" // enabled = false: admitted uncounted
)

// Metrics holds every collector.
type Metrics struct {
	// RLSDecisions counts the rate limit service's descriptors by domain
	// (configured ones only: a caller chooses the domain) and outcome.
	RLSDecisions  *prometheus.CounterVec
	Registry      *prometheus.Registry
	Decisions     *prometheus.CounterVec
	CheckDuration prometheus.Histogram
	RedisErrors   *prometheus.CounterVec
	ConfigReloads *prometheus.CounterVec
	LeaseGranted  prometheus.Counter
	Penalties     prometheus.Counter
	// ChargedTokens counts what charges spent after responses, by rule;
	// ChargesUnreported the charges whose response reported no cost, by
	// why (the rule's unreported cost was charged).
	ChargedTokens     *prometheus.CounterVec
	ChargesUnreported *prometheus.CounterVec
	// LeftOut is the runtime rules and tiers the live policy leaves out.
	LeftOut prometheus.Gauge

	// The same numbers under the names the seed's dashboards read:
	// requests by status (allowed, blocked) and a latency histogram with
	// millisecond buckets.
	seedRequests *prometheus.CounterVec
	seedLatency  prometheus.Histogram
}

// New registers the metrics. pool reports the Redis pool's statistics.
func New(pool func() *redis.PoolStats) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_decisions_total",
			Help: "Rate-limit decisions by result (allowed, denied, degraded, exempt, log_only, disabled), tier and deciding rule.",
		}, []string{"result", "tier", "rule"}),
		CheckDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tollgate_check_duration_seconds",
			Help:    "Time to decide one check, Redis included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		RedisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_redis_errors_total",
			Help: "Redis calls that failed, by operation.",
		}, []string{"op"}),
		RLSDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_rls_decisions_total",
			Help: "Descriptors answered by the rate limit service (gRPC), by domain (\"other\" for domains not configured) and code (ok, over_limit, shadow_over_limit, unlimited, no_limit, degraded).",
		}, []string{"domain", "code"}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_config_reloads_total",
			Help: "Configuration reloads by result (success, failure); a failed reload keeps the old config live.",
		}, []string{"result"}),
		LeaseGranted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_lease_tokens_granted_total",
			Help: "Tokens handed to filters for their local caches.",
		}),
		Penalties: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_penalty_denials_total",
			Help: "Denials whose wait a progressive penalty lengthened.",
		}),
		seedRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rate_limiter_requests_total",
			Help: "Requests decided, by status: allowed (exempt, log-only and degraded passes included) or blocked. tollgate_decisions_total breaks them down by tier and rule.",
		}, []string{"status"}),
		seedLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rate_limiter_latency_seconds",
			Help:    "Time to decide one check, Redis included (tollgate_check_duration_seconds with the seed's buckets).",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		ChargedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_charged_cost_total",
			Help: "Cost charged after responses (cost_from response_*: LLM tokens...), beyond each admission's 1, by rule.",
		}, []string{"rule"}),
		ChargesUnreported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_charges_unreported_total",
			Help: "Charges whose response reported no usable cost, by reason (missing, invalid, malformed, encoded, too_large, cut): the rule's unreported cost was charged.",
		}, []string{"reason"}),
		LeftOut: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_runtime_entries_left_out",
			Help: "Runtime rules and tiers stored in Redis that the live policy leaves out because they no longer fit the config file (logged as 'runtime entry left out'); alert on > 0.",
		}),
	}
	reg.MustRegister(m.Decisions, m.RLSDecisions, m.CheckDuration, m.RedisErrors, m.ConfigReloads, m.LeaseGranted, m.Penalties, m.LeftOut, m.ChargedTokens, m.ChargesUnreported,
		m.seedRequests, m.seedLatency,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if pool != nil {
		reg.MustRegister(poolCollector{pool})
	}
	return m
}

// Decided counts one decision: by result, tier and deciding rule (a bounded
// set: the configured rules, not the raw path), and by status.
func (m *Metrics) Decided(result, tier, rule string) {
	m.Decisions.WithLabelValues(result, tier, rule).Inc()
	status := "allowed"
	if result == Denied {
		status = "blocked"
	}
	m.seedRequests.WithLabelValues(status).Inc()
}

// RLSDecision counts one descriptor the rate limit service answered.
func (m *Metrics) RLSDecision(domain, code string) {
	m.RLSDecisions.WithLabelValues(domain, code).Inc()
}

// CheckTook records how long one check took to decide.
func (m *Metrics) CheckTook(seconds float64) {
	m.CheckDuration.Observe(seconds)
	m.seedLatency.Observe(seconds)
}

// RegisterBreaker exports the state of the Redis circuit breaker.
func (m *Metrics) RegisterBreaker(open func() bool) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tollgate_redis_breaker_open",
		Help: "1 while the Redis circuit breaker skips Redis and answers by the failure mode.",
	}, func() float64 {
		if open() {
			return 1
		}
		return 0
	}))
}

// RegisterConnections exports a listener's refused connections (refused
// counts them) and its open ones, labelled by listener ("http", "grpc").
func (m *Metrics) RegisterConnections(listener string, refused func() uint64, open func() int) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "tollgate_connections_refused_total",
		Help:        "Connections closed at once because their peer address held max_connections_per_address, or the listener its share of the file descriptors, and gRPC connections that made no authorized call within 10 s.",
		ConstLabels: prometheus.Labels{"listener": listener},
	}, func() float64 { return float64(refused()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tollgate_connections_open",
			Help:        "Connections the listener holds.",
			ConstLabels: prometheus.Labels{"listener": listener},
		}, func() float64 { return float64(open()) }))
}

var (
	poolHits     = prometheus.NewDesc("tollgate_redis_pool_hits_total", "Times a free connection was found in the pool.", nil, nil)
	poolMisses   = prometheus.NewDesc("tollgate_redis_pool_misses_total", "Times a connection had to be dialled.", nil, nil)
	poolTimeouts = prometheus.NewDesc("tollgate_redis_pool_timeouts_total", "Times waiting for a connection timed out.", nil, nil)
	poolTotal    = prometheus.NewDesc("tollgate_redis_pool_connections", "Connections in the pool.", nil, nil)
	poolIdle     = prometheus.NewDesc("tollgate_redis_pool_idle_connections", "Idle connections in the pool.", nil, nil)
	// seedPoolSize is tollgate_redis_pool_connections under the seed's name.
	seedPoolSize = prometheus.NewDesc("redis_connection_pool_size", "Current Redis connections (tollgate_redis_pool_connections).", nil, nil)
)

// poolCollector reads the pool's statistics at scrape time.
type poolCollector struct{ stats func() *redis.PoolStats }

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolHits, poolMisses, poolTimeouts, poolTotal, poolIdle, seedPoolSize} {
		ch <- d
	}
}

func (p poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := p.stats()
	if s == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(poolHits, prometheus.CounterValue, float64(s.Hits))
	ch <- prometheus.MustNewConstMetric(poolMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(poolTimeouts, prometheus.CounterValue, float64(s.Timeouts))
	ch <- prometheus.MustNewConstMetric(poolTotal, prometheus.GaugeValue, float64(s.TotalConns))
	ch <- prometheus.MustNewConstMetric(poolIdle, prometheus.GaugeValue, float64(s.IdleConns))
	ch <- prometheus.MustNewConstMetric(seedPoolSize, prometheus.GaugeValue, float64(s.TotalConns))
}
