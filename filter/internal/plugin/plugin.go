// Package plugin is the Tollgate filter: it resolves the caller, spends
// tokens from the shared lease cache, asks the control service on a miss, and
// writes the verdict into headers both ways (or answers 429 itself).
package plugin

import (
	"encoding/binary"
	"syscall"

	"github.com/tollgate-rl/tollgate/filter/internal/fallback"
	"github.com/tollgate-rl/tollgate/filter/internal/jwt"
	"github.com/tollgate-rl/tollgate/filter/internal/leasecache"
	"github.com/tollgate-rl/tollgate/filter/pluginconf"
	"github.com/tollgate-rl/tollgate/filter/proxywasm"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/headermap"
	"github.com/tollgate-rl/tollgate/filter/proxywasm/types"
	"github.com/tollgate-rl/tollgate/shared/breaker"
	"github.com/tollgate-rl/tollgate/shared/wire"
)

// VM is the VM context to install with proxywasm.SetVMContext.
type VM struct{ types.DefaultVMContext }

// NewPluginContext implements types.VMContext.
func (VM) NewPluginContext(id uint32) types.PluginContext { return &pluginContext{rootID: id} }

type metrics struct {
	allowed, denied, degraded, localHits, calloutFailures, rejected proxywasm.MetricCounter
	charges, chargeFailures, chargesUnreported, leasePaid           proxywasm.MetricCounter
	refillWaits, leaseReturns                                       proxywasm.MetricCounter
	calloutLatency                                                  proxywasm.MetricHistogram
}

type pluginContext struct {
	types.DefaultPluginContext
	cfg       *pluginconf.Config
	verifier  *jwt.Verifier
	badTokens badTokens // failed token checks per client address (badtokens.go)
	cache     *leasecache.Cache
	breaker   *breaker.Breaker
	fallback  *fallback.Limiter
	// headerSet is the rate-limit header fields the configuration selects.
	headerSet wire.HeaderSet
	// readLengths are the lengths of the request header names the filter
	// reads (http.go).
	readLengths uint64
	// decoder reads the control service's decisions (its buffers and
	// strings kept from one to the next).
	decoder wire.Decoder
	// headerBuf and headerFields are reused to render each response's
	// rate-limit header fields (a VM runs one callback at a time).
	headerBuf []byte
	// bodyBuf is reused for each callout's body: the host copies it.
	bodyBuf      []byte
	headerFields [wire.MaxHeaderFields]wire.HeaderField
	// replyBody, replyFields and replyMap are reused for each refusal the
	// filter answers itself (the host copies them): a refused client's
	// flood is the traffic an attacker chooses, so it allocates least.
	replyBody   []byte
	replyFields []headermap.Field
	replyMap    []byte
	// calloutHeaders are the control service callout's headers, the same
	// on every call: serialised once.
	calloutHeaders []byte
	chargeHeaders  []byte // the same for a charge (wire.PathCharge)
	// inflight holds, per bucket with a callout of this VM in flight, the
	// requests of that bucket waiting for its answer (coalesce.go).
	inflight map[leasecache.Owner][]*httpContext
	// watched are the buckets whose waiters wait for another VM's refill,
	// looked at again on each tick (coalesce.go); watchedSpare is the
	// other of the two slices OnTick swaps.
	watched, watchedSpare []watched
	// kept are the leases this VM kept, oldest first, until a tick after
	// they end hands back what they left (returns.go); nextReturnMs is
	// when a tick next looks.
	kept         []keptLease
	keptHead     int // the oldest's index in kept
	keptBytes    int // the kept leases' strings' bytes
	nextReturnMs int64
	tickMs       uint32 // the tick's period asked for (retick)
	rootID       uint32
	m            metrics
}

// OnPluginStart parses the configuration; a bad one fails the start loudly,
// naming the field.
func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && err != types.ErrorStatusNotFound {
		proxywasm.LogCritical("tollgate: read plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	cfg, err := pluginconf.Parse(data)
	if err == nil {
		if terr := cfg.ResolveToken(syscall.Getenv); terr != nil {
			err = terr
		}
	}
	if err != nil {
		proxywasm.LogCritical("tollgate: invalid plugin configuration: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.readLengths = readLengths(cfg.APIKeyHeader, cfg.CostHeaders)
	// X-RateLimit-Strategy goes with the X-RateLimit fields, as the
	// service sends it.
	p.headerSet = wire.HeaderSet{XRateLimit: cfg.Headers.XRateLimitOn(), Strategy: cfg.Headers.XRateLimitOn(), IETF: cfg.Headers.IETF}.WithPrefix(cfg.Headers.Prefix)
	p.headerBuf = make([]byte, 0, 256)
	callout := [][2]string{
		{":method", "POST"}, {":path", wire.PathCheck}, {":authority", cfg.ControlAuthority},
		{"content-type", "application/json"},
	}
	if cfg.DecisionToken != "" {
		callout = append(callout, [2]string{"authorization", "Bearer " + cfg.DecisionToken})
	}
	p.calloutHeaders = headermap.Encode(callout)
	callout[1][1] = wire.PathCharge
	p.chargeHeaders = headermap.Encode(callout)
	if j := cfg.JWT; j != nil {
		keys, err := jwt.ParseJWKS(j.JWKS) // Parse checked it
		if err != nil {
			proxywasm.LogCritical("tollgate: invalid plugin configuration: jwt.jwks: " + err.Error())
			return types.OnPluginStartStatusFailed
		}
		var key [16]byte
		if err := proxywasm.RandomBytes(key[:]); err != nil {
			proxywasm.LogCritical("tollgate: random bytes for the token cache: " + err.Error())
			return types.OnPluginStartStatusFailed
		}
		p.verifier = jwt.NewVerifier(jwt.Options{Keys: keys, Issuer: j.Issuer, Audiences: j.Audiences,
			SubjectClaim: j.SubjectClaim, TierClaim: j.TierClaim, TenantClaim: j.TenantClaim,
			LeewaySeconds: j.LeewaySeconds, CacheSize: j.CacheSize,
			CacheKey: [2]uint64{binary.LittleEndian.Uint64(key[:8]), binary.LittleEndian.Uint64(key[8:])}})
	}
	cache, err := leasecache.New(sharedData{}, proxywasm.RandomBytes, "tollgate.lease", cfg.Lease.Slots)
	if err != nil {
		proxywasm.LogCritical("tollgate: lease cache: " + err.Error())
		return types.OnPluginStartStatusFailed
	}
	p.cache = cache
	p.inflight = map[leasecache.Owner][]*httpContext{}
	p.breaker = breaker.New(cfg.Breaker.Failures, cfg.Breaker.CooldownMs*1e6)
	p.fallback = fallback.New(cfg.Fallback.Limit, cfg.Fallback.WindowSeconds, cfg.Fallback.MaxCallers)
	p.m = metrics{
		allowed:         proxywasm.DefineCounterMetric("tollgate_allowed_total"),
		denied:          proxywasm.DefineCounterMetric("tollgate_denied_total"),
		degraded:        proxywasm.DefineCounterMetric("tollgate_degraded_total"),
		localHits:       proxywasm.DefineCounterMetric("tollgate_lease_hits_total"),
		calloutFailures: proxywasm.DefineCounterMetric("tollgate_callout_failures_total"),
		rejected:        proxywasm.DefineCounterMetric("tollgate_rejected_total"),
		calloutLatency:  proxywasm.DefineHistogramMetric("tollgate_callout_latency_ms"),
		// Charges of costs read from responses (LLM tokens): sent, lost
		// (not dispatched, refused, unanswered), and those whose response
		// reported no usable cost (the rule's unreported cost charged).
		charges:           proxywasm.DefineCounterMetric("tollgate_charges_total"),
		chargeFailures:    proxywasm.DefineCounterMetric("tollgate_charge_failures_total"),
		chargesUnreported: proxywasm.DefineCounterMetric("tollgate_charges_unreported_total"),
		// Tokens of response costs paid from leases, with no charge sent.
		leasePaid: proxywasm.DefineCounterMetric("tollgate_lease_paid_cost_total"),
		// Requests that waited for their bucket's refill in flight (this
		// VM's or another's) instead of calling out themselves.
		refillWaits: proxywasm.DefineCounterMetric("tollgate_refill_waits_total"),
		// Leases that ended with tokens left, handed back by a tick
		// (returns.go).
		leaseReturns: proxywasm.DefineCounterMetric("tollgate_lease_returns_total"),
	}
	proxywasm.LogInfo("tollgate: plugin started; control cluster " + cfg.ControlCluster + ", " + cfg.FailureMode)
	return types.OnPluginStartStatusOK
}

// NewHttpContext implements types.PluginContext.
func (p *pluginContext) NewHttpContext(id uint32) types.HttpContext {
	return &httpContext{p: p, contextID: id}
}

// sharedData is the lease cache's store: proxy-wasm shared data, process-wide
// per vm_id, with the host's CAS rules (a non-zero CAS on a missing key
// inserts, which the cache relies on to create its hash key and fill empty
// slots without overwriting another VM's write). GetSharedData copies the
// value into a fresh slice per call, so the cache may patch it in place.
type sharedData struct{}

func (sharedData) Get(key string) ([]byte, uint32, error) {
	b, cas, err := proxywasm.GetSharedData(key)
	if err == types.ErrorStatusNotFound {
		return nil, 0, leasecache.ErrNotFound
	}
	return b, cas, err
}

// Peek reads an entry into the scratch buffer (leasecache.Peeker).
func (sharedData) Peek(key string) ([]byte, error) {
	b, _, err := proxywasm.GetSharedDataScratch(key)
	if err == types.ErrorStatusNotFound {
		return nil, leasecache.ErrNotFound
	}
	return b, err
}

func (sharedData) Set(key string, data []byte, cas uint32) error {
	err := proxywasm.SetSharedData(key, data, cas)
	if err == types.ErrorStatusCasMismatch {
		return leasecache.ErrCasMismatch
	}
	return err
}
