// Package gateway is a development HTTP proxy that runs the Tollgate filter
// under wasmhost for every request, like Envoy does: a pool of VMs (Envoy's
// workers), callouts made as real asynchronous HTTP requests to named
// clusters with their timeouts, allowed requests forwarded upstream. Envoy is
// the production host; this one serves `make run`, end-to-end tests and
// benchmarks on machines without Envoy.
package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/tollgate-rl/tollgate/filter/devhost/wasmhost"
	"github.com/tollgate-rl/tollgate/shared/identity"
)

// Config of a gateway.
type Config struct {
	// Wasm is the module; PluginConfig its configuration.
	Wasm         []byte
	PluginConfig []byte
	// Upstream receives allowed requests.
	Upstream *url.URL
	// Clusters maps the cluster names callouts use to base URLs.
	Clusters map[string]*url.URL
	// VMs is the number of VMs (Envoy: one per worker thread).
	VMs int
	// NoFilter forwards every request without the filter (for benchmarks:
	// Envoy's own work on a request is still done).
	NoFilter bool
	// XFFTrustedHops is how many trusted proxies stand in front of the
	// gateway, as Envoy's xff_num_trusted_hops with use_remote_address: the
	// client address served as source.address is the X-Forwarded-For entry
	// that many from the right (before the gateway appends its peer), or the
	// peer itself when 0. Whatever it is, the peer is appended.
	XFFTrustedHops int
	// ClusterTLS, when set, is how callouts to https clusters verify the
	// service and present a client certificate (Envoy: the cluster's
	// transport_socket).
	ClusterTLS *tls.Config
	// HeldBodies bounds the request body bytes the gateway holds at once
	// for the filter (form POSTs it reads for a method override, each at
	// most 1 MiB), as Envoy's overload manager sheds load past a memory
	// bound: a request that would pass it is answered 503. 0: 64 MiB.
	HeldBodies int64
	Log        *slog.Logger
	// CompilationCache, when set, is shared by gateways of one process
	// (tests): the module compiles once.
	CompilationCache wazero.CompilationCache
	// Now, when set, is the clock the filter sees (tests: a lease's expiry
	// without waiting for it).
	Now func() time.Time
}

// Gateway is an http.Handler.
type Gateway struct {
	cfg Config
	// held counts the request body bytes held for the filter now.
	held   atomic.Int64
	host   *wasmhost.Host
	vms    []*worker
	next   atomic.Uint64
	proxy  *httputil.ReverseProxy
	client *http.Client
	log    *slog.Logger
	// stop ends the VMs' tick loops; ticks counts them out.
	stop  context.CancelFunc
	ticks sync.WaitGroup
}

// worker is one VM and the lock that serialises calls into it. The lock is
// held only while the guest runs, never while a callout is in flight.
type worker struct {
	mu      sync.Mutex
	vm      *wasmhost.VM
	pending []*wasmhost.Callout
	// changed is closed (and replaced) after every callout answer the VM
	// takes: a stream waiting for an answer, its own or another stream's
	// (the filter coalesces one bucket's refills), looks again.
	changed chan struct{}
	// tickWake tells the VM's tick loop that the VM asked for another
	// tick period (period: the one it last asked for; wk.mu is held).
	tickWake chan struct{}
	period   time.Duration
}

// decisions counts the streams the VM resumed or answered itself, the
// calls that can end a stream's wait; wk.mu is held.
func (wk *worker) decisions() int {
	return wk.vm.HostCalls("proxy_continue_stream") + wk.vm.HostCalls("proxy_send_local_response")
}

// notify wakes the streams waiting on this VM; wk.mu is held.
func (wk *worker) notify() {
	close(wk.changed)
	wk.changed = make(chan struct{})
}

// New compiles the module and starts the VMs. A plugin that refuses its
// configuration is an error.
func New(ctx context.Context, cfg Config) (*Gateway, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.VMs < 1 {
		cfg.VMs = 1
	}
	g := &Gateway{cfg: cfg, log: cfg.Log, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, TLSClientConfig: cfg.ClusterTLS}}}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(cfg.Upstream)
			// ReverseProxy re-encoded the query before Rewrite, dropping
			// every parameter with a ';' and re-escaping bad '%' escapes;
			// Envoy forwards it as the client sent it (or as the filter
			// rewrote :path), and the upstream must see what the filter saw.
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			if q := cfg.Upstream.RawQuery; q != "" {
				pr.Out.URL.RawQuery = q + "&" + pr.In.URL.RawQuery
			}
			pr.Out.Host = pr.In.Host
			// ReverseProxy drops X-Forwarded-For before Rewrite; Envoy sends
			// it on, with its peer appended (resolveClient did that).
			if xff := pr.In.Header["X-Forwarded-For"]; len(xff) > 0 {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			// ReverseProxy also dropped every header the client's
			// Connection header named; Envoy drops none a filter added, so
			// a client cannot take the filter's x-tollgate-* headers off
			// the upstream request.
			for k, v := range pr.In.Header {
				if strings.HasPrefix(k, "X-Tollgate-") {
					pr.Out.Header[k] = v
				}
			}
		},
		Transport:      &http.Transport{MaxIdleConnsPerHost: 256},
		ModifyResponse: g.filterResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The proxy's own refusals first: the body stopped there, and a
			// check the filter had sent for it may have answered since
			// (under load the override's 429 went out in place of the 413).
			if errors.Is(err, errBufferLimit) {
				g.proxyAnswer(w, r, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "the request body is larger than the proxy buffers for its filters")
				return
			}
			if errors.Is(err, errOverloaded) {
				g.proxyAnswer(w, r, http.StatusServiceUnavailable, "OVERLOADED", "the proxy holds too many request bodies; retry later")
				return
			}
			if l := answered(r); l != nil {
				// The filter answered while the body went on (a form
				// body's method override refused): Envoy resets the
				// upstream request and sends the filter's answer.
				writeLocal(w, l)
				return
			}
			g.log.Warn("upstream failed", "err", err)
			g.proxyAnswer(w, r, http.StatusBadGateway, "UPSTREAM_UNAVAILABLE", "the upstream did not answer")
		},
	}
	if cfg.NoFilter {
		return g, nil
	}
	names := make([]string, 0, len(cfg.Clusters))
	for n := range cfg.Clusters {
		names = append(names, n)
	}
	// The module gets the WASI of the oldest Envoy it supports (1.33-1.38:
	// poll_oneoff fails, allow-lists while it starts and allocates), so
	// `make run` and the end-to-end tests run it as that Envoy would.
	host, err := wasmhost.New(ctx, cfg.Wasm, wasmhost.Options{
		PluginConfig: cfg.PluginConfig, Clusters: names, CompilationCache: cfg.CompilationCache,
		WASI: wasmhost.WASIEnvoy, Now: cfg.Now,
		Log: func(level wasmhost.LogLevel, msg string) {
			g.log.Log(context.Background(), slogLevel(level), msg, "source", "filter")
		},
	})
	if err != nil {
		return nil, err
	}
	g.host = host
	for i := 0; i < cfg.VMs; i++ {
		vm, err := host.NewVM(ctx)
		if err != nil {
			host.Close(ctx)
			return nil, fmt.Errorf("vm %d: %w", i, err)
		}
		w := &worker{vm: vm, changed: make(chan struct{}), tickWake: make(chan struct{}, 1)}
		vm.OnCallout = func(c *wasmhost.Callout) { w.pending = append(w.pending, c) }
		g.vms = append(g.vms, w)
	}
	tctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	for _, w := range g.vms {
		g.ticks.Add(1)
		go g.tickLoop(tctx, w)
	}
	return g, nil
}

// Close releases the VMs. Each is closed under its lock: a callout's
// answer or a request still in flight afterwards gets the closed VM's
// error rather than run the guest in memory already unmapped (a late
// answer crashed the process).
func (g *Gateway) Close(ctx context.Context) error {
	if g.host == nil {
		return nil
	}
	g.stop()
	g.ticks.Wait()
	for _, wk := range g.vms {
		wk.mu.Lock()
		_ = wk.vm.Close(ctx)
		wk.mu.Unlock()
	}
	return g.host.Close(ctx)
}

// tickLoop runs a VM's tick at the period it asked for, as Envoy's timer
// on the worker does, while it asks for one (the filter ticks while
// requests wait for another VM's refill, and while leases it kept wait to
// end); a tick's callouts are performed and its waiting streams woken. A
// new period re-arms the timer at once, as Envoy's setTickPeriod does: a
// VM ticking every 200 ms for its leases that starts watching a refill
// must tick within a millisecond (waiting out the 200 ms held refill
// waiters up to 92 ms at p99 in make bench).
func (g *Gateway) tickLoop(ctx context.Context, wk *worker) {
	defer g.ticks.Done()
	for {
		wk.mu.Lock()
		period := wk.vm.TickPeriod()
		wk.mu.Unlock()
		var t *time.Timer
		var fire <-chan time.Time
		if period > 0 {
			t = time.NewTimer(period)
			fire = t.C
		}
		select {
		case <-fire:
			g.drive(wk, "filter tick failed", func() error { return wk.vm.Tick(context.Background()) })
		case <-wk.tickWake:
		case <-ctx.Done():
			return
		}
		if t != nil {
			t.Stop()
		}
	}
}

// drive runs one callback into the VM that no stream of its own waits on (a
// tick, a callout's answer): then the callouts it dispatched are performed
// and, if it resumed or answered a stream (or failed), the streams waiting
// on the VM look again. (A tick that decides nothing wakes none: with many
// streams paused, waking them all every millisecond cost more than the
// filter's work.)
func (g *Gateway) drive(wk *worker, failed string, call func() error) {
	wk.mu.Lock()
	before := wk.decisions()
	err := call()
	calls := wk.takePending()
	if err != nil || wk.decisions() != before {
		wk.notify()
	}
	wk.mu.Unlock()
	if err != nil {
		g.log.Warn(failed, "err", err)
	}
	g.perform(wk, calls)
}

// VMMemory is the guest memory of each VM, in bytes (soaks watch it).
func (g *Gateway) VMMemory() []uint32 {
	out := make([]uint32, len(g.vms))
	for i, w := range g.vms {
		w.mu.Lock()
		out[i] = w.vm.MemorySize()
		w.mu.Unlock()
	}
	return out
}

// Host exposes the filter's host (metrics, shared data) to tests.
func (g *Gateway) Host() *wasmhost.Host { return g.host }

type streamKey struct{}

type streamRef struct {
	w *worker
	s *wasmhost.Stream
}

// ServeHTTP runs one request through the filter. Without it (NoFilter),
// the request still gets what Envoy's connection manager does before any
// filter (the bounds below, an x-request-id, the client resolved and
// appended to X-Forwarded-For): the baseline a benchmark compares the
// filter with is Envoy without the filter, not a bare reverse proxy.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if n := len(r.Header); n > maxRequestHeaders {
		writeError(w, http.StatusRequestHeaderFieldsTooLarge, "INVALID_INPUT", "too many request headers")
		return
	}
	if strings.ContainsRune(r.RequestURI, '#') {
		// Envoy refuses a request target with a fragment (400). Passed on,
		// the filter would count the path with its '#' escaped while an
		// upstream that drops the fragment serves the path without it.
		writeError(w, http.StatusBadRequest, "INVALID_INPUT", "a request target carries no fragment ('#')")
		return
	}
	if len(r.Header.Values("Upgrade")) > 0 {
		// Envoy refuses an upgrade (WebSocket, h2c...) its connection
		// manager has no upgrade_configs for; proxied, the upgraded
		// connection would carry any number of requests past the filter.
		writeError(w, http.StatusForbidden, "UPGRADE_NOT_ALLOWED", "protocol upgrades are not enabled on this gateway")
		return
	}
	// Envoy gives every request an x-request-id at the edge, replacing a
	// client's (preserve_external_request_id is off by default).
	r.Header.Set("X-Request-Id", newRequestID())
	source := g.resolveClient(r)
	if g.cfg.NoFilter {
		g.proxy.ServeHTTP(w, r)
		return
	}
	wk := g.vms[g.next.Add(1)%uint64(len(g.vms))]
	ctx := r.Context()
	wk.mu.Lock()
	s, err := wk.vm.NewStream(ctx, requestHeaders(r), map[string]string{
		"source.address": source, "request.path": r.URL.RequestURI(), "request.method": r.Method,
		"request.host": r.Host, "request.scheme": scheme(r),
	})
	var act wasmhost.Action
	if err == nil {
		act, err = s.OnRequestHeaders(ctx, r.ContentLength == 0)
	}
	calls := wk.takePending()
	wk.mu.Unlock()
	if err != nil {
		g.broken(w, wk, err)
		return
	}
	defer func() {
		wk.mu.Lock()
		_ = s.Done(context.Background())
		late := wk.takePending() // a charge of a response cut short
		wk.mu.Unlock()
		g.perform(wk, late)
	}()
	// From here another goroutine may deliver an answer that decides this
	// stream (its own callout's, or its bucket's refill): s is read under
	// wk.mu only.
	g.perform(wk, calls)
	if act == wasmhost.Pause && !g.await(ctx, wk, func() bool { return s.Local != nil || s.Resumed }) {
		writeError(w, http.StatusGatewayTimeout, "GATEWAY_TIMEOUT", "the filter did not decide")
		return
	}
	wk.mu.Lock()
	local := s.Local
	var header http.Header
	var path string
	if local == nil {
		header, path = httpHeaders(s.RequestHeaders), s.RequestHeaders.Value(":path")
	}
	wk.mu.Unlock()
	if local != nil {
		writeLocal(w, local)
		return
	}
	// A shallow copy: the proxy clones the request again before it
	// changes anything, and the headers are the filter's new map.
	ref := streamRef{wk, s}
	out := r.WithContext(context.WithValue(ctx, streamKey{}, ref))
	out.Header = header
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		// The body goes upstream through the filter's body callback, as
		// Envoy passes it once the headers went on.
		out.Body = g.requestBody(ctx, ref, r.Body)
	}
	if path != r.URL.RequestURI() {
		// The filter rewrote :path (method_override: strip takes _method
		// out of the query): the upstream gets the new one, as from Envoy.
		u, err := url.ParseRequestURI(path)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "INTERNAL", "the filter set a :path that is not a request target")
			return
		}
		out.URL = &url.URL{Scheme: r.URL.Scheme, Host: r.URL.Host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}
	}
	g.proxy.ServeHTTP(w, out)
}

// maxRequestHeaders is Envoy's default max_headers_count: a request with more
// header fields is refused before any filter runs.
const maxRequestHeaders = 100

// resolveClient does what Envoy's connection manager does with
// use_remote_address: true. It resolves the client address from the peer and,
// with XFFTrustedHops, from X-Forwarded-For as received, then appends the
// peer to X-Forwarded-For (to the last line, or as a new one) so the filter
// and the upstream see the header Envoy would send. It returns the value of
// source.address.
func (g *Gateway) resolveClient(r *http.Request) string {
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = r.RemoteAddr
	}
	source := r.RemoteAddr
	xff := r.Header["X-Forwarded-For"] // the header itself: the peer is appended in place
	if g.cfg.XFFTrustedHops > 0 && len(xff) > 0 {
		// Hops trusted proxies each appended one entry; the client's is
		// the one left of them. The peer is the last of those proxies.
		addr, src, err := identity.ClientIP(identity.ClientIPInput{
			SourceAddress: r.RemoteAddr, ForwardedFor: strings.Join(xff, ",") + "," + peer, XFFTrustedHops: g.cfg.XFFTrustedHops,
		})
		if err == nil && src == identity.SourceForwardedFor {
			source = addr.String()
		}
	}
	if len(xff) == 0 {
		r.Header.Set("X-Forwarded-For", peer)
	} else {
		xff[len(xff)-1] += ", " + peer
	}
	return source
}

// HTTPServer is the server a gateway runs in, with the bounds Envoy has by
// default: request headers of at most 60 KiB, and no client may hold a
// connection open by trickling headers or a body, or by idling.
func (g *Gateway) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    60 << 10,
	}
}

// perform runs callouts as Envoy's async client does, whoever dispatched
// them, and delivers each answer to the VM; the callouts a delivery
// dispatches (a waiting request's own, a charge) are performed in turn.
// Every answer is delivered, whether or not a client still waits.
func (g *Gateway) perform(wk *worker, calls []*wasmhost.Callout) {
	for _, c := range calls {
		go func(c *wasmhost.Callout) {
			res := calloutResult{c, g.callout(context.Background(), c)}
			g.drive(wk, "deliver a callout answer", func() error { return wk.deliver(res) })
		}(c)
	}
}

// await waits until decided (read with wk.mu held) says the stream may go
// on; false if the client went away first.
func (g *Gateway) await(ctx context.Context, wk *worker, decided func() bool) bool {
	for {
		wk.mu.Lock()
		done, changed := decided(), wk.changed
		wk.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// calloutResult is a callout and its answer (nil: a reset).
type calloutResult struct {
	c    *wasmhost.Callout
	resp *wasmhost.CalloutResponse
}

// callout performs one callout as Envoy's async client would: a timeout
// becomes the 504 Envoy generates; a connection failure a reset (nil).
func (g *Gateway) callout(ctx context.Context, c *wasmhost.Callout) *wasmhost.CalloutResponse {
	base, ok := g.cfg.Clusters[c.Cluster]
	if !ok {
		return nil
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(c.TimeoutMs)*time.Millisecond)
	defer cancel()
	u := *base
	path := c.Headers.Value(":path")
	u.Path, u.RawQuery, _ = strings.Cut(path, "?")
	req, err := http.NewRequestWithContext(cctx, c.Headers.Value(":method"), u.String(), bytes.NewReader(c.Body))
	if err != nil {
		return nil
	}
	req.Host = c.Headers.Value(":authority")
	addHeaders(req.Header, c.Headers)
	resp, err := g.client.Do(req)
	if err != nil {
		var op *net.OpError
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return &wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "504"}, {"content-type", "text/plain"}}, Body: []byte("upstream request timeout")}
		case errors.As(err, &op) && op.Op == "dial":
			// Envoy's answer when no connection could be made.
			return &wasmhost.CalloutResponse{Headers: wasmhost.Headers{{":status", "503"}, {"content-type", "text/plain"}},
				Body: []byte("upstream connect error or disconnect/reset before headers. reset reason: connection failure")}
		}
		return nil // a reset: no headers, no body
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil
	}
	h := appendHeaders(wasmhost.Headers{{":status", strconv.Itoa(resp.StatusCode)}}, resp.Header)
	return &wasmhost.CalloutResponse{Headers: h, Body: body}
}

// filterResponse runs the upstream's response through the filter: its
// headers now, its body as the client reads it (responseBody). Headers the
// filter holds (it reads the body first) go out once it resumes the
// response: the body is read through the filter until then.
func (g *Gateway) filterResponse(resp *http.Response) error {
	ref, ok := resp.Request.Context().Value(streamKey{}).(streamRef)
	if !ok {
		return nil
	}
	h := make(wasmhost.Headers, 0, 1+len(resp.Header))
	h = appendHeaders(append(h, [2]string{":status", strconv.Itoa(resp.StatusCode)}), resp.Header)
	ctx := resp.Request.Context()
	noBody := resp.Body == nil || resp.Body == http.NoBody || resp.ContentLength == 0
	ref.w.mu.Lock()
	act, err := ref.s.OnResponseHeaders(context.Background(), h, noBody)
	calls := ref.w.takePending()
	ref.w.mu.Unlock()
	if err != nil {
		return err
	}
	g.perform(ref.w, calls)
	// Held headers hold the body too: Envoy calls no body callback of a
	// filter holding the response headers (StopIteration is
	// StopAllIterationAndWatermark) until it resumes them.
	if act == wasmhost.Pause && !g.await(ctx, ref.w, func() bool { return ref.s.ResponseResumed }) {
		return errors.New("the client went away while the filter held the response")
	}
	if !noBody {
		resp.Body = g.responseBody(ctx, ref, resp.Body)
	}
	ref.w.mu.Lock()
	out := ref.s.ResponseHeaders
	ref.w.mu.Unlock()
	resp.Header = httpHeaders(out)
	return nil
}

// proxyAnswer sends the proxy's own answer to a request the filter let
// through (the body past the buffer, the upstream down) along the filter's
// response path, as Envoy sends a router's local reply through the
// encoder filters: the filter sees an error answer reporting no usage
// (written past it, its request's charge was a cut stream's: 1,000 tokens
// for a 413, attack 61 B2).
func (g *Gateway) proxyAnswer(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if ref, ok := r.Context().Value(streamKey{}).(streamRef); ok {
		ref.w.mu.Lock()
		seen := ref.s.ResponseHeaders != nil
		ref.w.mu.Unlock()
		if seen {
			// The filter had this stream's response (the client went
			// while it held it): one response a stream, as in Envoy (run
			// again, the request was charged twice: attack 62 C1).
			writeError(w, status, code, msg)
			return
		}
	}
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q}}`, code, msg)
	resp := &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}
	if err := g.filterResponse(resp); err != nil {
		writeError(w, status, code, msg)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(status)
	_, _ = io.Copy(w, resp.Body)
}

// answered is the filter's own answer to a request it answered while its
// body went on (nil when it did not).
func answered(r *http.Request) *wasmhost.LocalResponse {
	ref, ok := r.Context().Value(streamKey{}).(streamRef)
	if !ok {
		return nil
	}
	ref.w.mu.Lock()
	defer ref.w.mu.Unlock()
	return ref.s.Local
}

// filtered is a body read through one of the filter's body callbacks,
// a chunk at a time, as Envoy passes a body: pass runs the callback and
// returns what the filter lets go (nil while it buffers), waiting when it
// holds the end until it lets it go.
type filtered struct {
	src  io.ReadCloser
	pass func(chunk []byte, end bool) (released []byte, err error)
	out  []byte // released; out[off:] not yet read
	off  int
	eof  bool // src is finished and passed through the filter
	// held is what the host holds of this body for the filter, counted in
	// its gateway's held (heldBy) until released or closed.
	held   atomic.Int64
	heldBy *atomic.Int64
}

// maxChunk is the most read per body callback; chunks is a pool of read
// buffers of that size (a body costs no 32 KiB allocation of its own).
const maxChunk = 32 << 10

var chunks = sync.Pool{New: func() any { b := make([]byte, maxChunk); return &b }}

func (b *filtered) Read(p []byte) (int, error) {
	for b.off >= len(b.out) {
		if b.eof {
			return 0, io.EOF
		}
		b.out, b.off = b.out[:0], 0 // all read: the buffer is reused
		if err := b.step(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.out[b.off:])
	b.off += n
	return n, nil
}

func (b *filtered) Close() error {
	b.release()
	return b.src.Close()
}

// release takes what the body held out of its gateway's count.
func (b *filtered) release() {
	if b.heldBy != nil {
		b.heldBy.Add(-b.held.Swap(0))
	}
}

// step reads one chunk and passes it through the filter.
func (b *filtered) step() error {
	bp := chunks.Get().(*[]byte)
	defer chunks.Put(bp)
	buf := *bp
	n, rerr := b.src.Read(buf)
	end := rerr == io.EOF
	if rerr != nil && !end {
		// Envoy's stream reset: the filter sees no end; OnHttpStreamDone
		// tells it the body was cut. What it held goes.
		b.release()
		return rerr
	}
	// As Envoy's HTTP/1 codec: the bytes with no end, then the end alone,
	// an empty chunk (Go's reader returns a Content-Length body's last
	// bytes with its end; a filter holding only the end chunk would hold
	// nothing in Envoy).
	if n > 0 {
		released, err := b.pass(buf[:n], false)
		if err != nil {
			return err
		}
		b.out = append(b.out, released...) // copied: released may be buf
	}
	if end {
		released, err := b.pass(nil, true)
		if err != nil {
			return err
		}
		b.out = append(b.out, released...)
		b.eof = true
	}
	return nil
}

// responseBody is an upstream's body through the filter's response body
// callback: when it pauses at the end (a charge in flight) the body waits
// for it to resume the response.
func (g *Gateway) responseBody(ctx context.Context, ref streamRef, src io.ReadCloser) *filtered {
	w, s := ref.w, ref.s
	return &filtered{src: src, pass: func(chunk []byte, end bool) ([]byte, error) {
		w.mu.Lock()
		act, released, err := s.OnResponseBody(context.Background(), chunk, end)
		calls := w.takePending()
		w.mu.Unlock()
		if err != nil {
			return nil, err
		}
		g.perform(w, calls)
		if act == wasmhost.Pause && end {
			if !g.await(ctx, w, func() bool { return s.ResponseResumed }) {
				return nil, errors.New("the client went away while the filter held the response")
			}
			w.mu.Lock()
			released = w.vm.ReleaseResponse(s.StreamState)
			w.mu.Unlock()
		}
		return released, nil
	}}
}

// requestBody is a client's body through the filter's request body
// callback: when it holds the end (a form body's method override being
// checked) the body waits until it resumes the request or answers it;
// then reading fails with errAnswered: the upstream request is given up,
// and the proxy's error handler sends the filter's answer.
func (g *Gateway) requestBody(ctx context.Context, ref streamRef, src io.ReadCloser) *filtered {
	w, s := ref.w, ref.s
	b := &filtered{src: src, heldBy: &g.held}
	b.pass = func(chunk []byte, end bool) ([]byte, error) {
		w.mu.Lock()
		act, released, err := s.OnRequestBody(context.Background(), chunk, end)
		calls := w.takePending()
		// Read under the lock: once the callouts go, an answer may end the
		// stream (and its held body) before this goroutine looks again.
		local, held := s.Local != nil, len(s.RequestBody)
		w.mu.Unlock()
		if err != nil {
			return nil, err
		}
		g.perform(w, calls)
		if act == wasmhost.Pause && !end && !local {
			if held > bufferLimit {
				b.release()
				return nil, errBufferLimit
			}
			b.held.Add(int64(len(chunk)))
			if g.held.Add(int64(len(chunk))) > g.heldBodies() {
				b.release()
				return nil, errOverloaded
			}
		}
		if act == wasmhost.Pause && end && !local {
			if !g.await(ctx, w, func() bool { return s.Local != nil || s.Resumed }) {
				return nil, errors.New("the client went away while the filter held the request")
			}
			w.mu.Lock()
			if local = s.Local != nil; !local {
				released = w.vm.ReleaseRequest(s.StreamState)
			}
			w.mu.Unlock()
		}
		if act == wasmhost.Continue || end || local {
			b.release() // released, or answered: held no more
		}
		if local {
			return nil, errAnswered
		}
		return released, nil
	}
	return b
}

var errAnswered = errors.New("the filter answered the request itself")

// bufferLimit is what the proxy holds of a request body the filter
// buffers (a form POST it reads for a method override): Envoy's default
// per_connection_buffer_limit_bytes, past which Envoy answers 413 and
// resets the upstream request.
const bufferLimit = 1 << 20

var errBufferLimit = errors.New("request body over the buffer limit")

var errOverloaded = errors.New("request bodies held over the gateway's bound")

// heldBodies is Config.HeldBodies or its default.
func (g *Gateway) heldBodies() int64 {
	if g.cfg.HeldBodies > 0 {
		return g.cfg.HeldBodies
	}
	return 64 << 20
}

// HeldBodyBytes is how many request body bytes the gateway holds for the
// filter now.
func (g *Gateway) HeldBodyBytes() int64 { return g.held.Load() }

// deliver hands the VM a callout's answer, or its failure; wk.mu is held.
func (wk *worker) deliver(res calloutResult) error {
	if res.resp == nil {
		return wk.vm.Fail(context.Background(), res.c.Token)
	}
	return wk.vm.Respond(context.Background(), res.c.Token, *res.resp)
}

// takePending returns the callouts the VM dispatched in its last call;
// wk.mu is held. Called after every call into the VM, it also wakes the
// tick loop when that call asked for another tick period.
func (wk *worker) takePending() []*wasmhost.Callout {
	if p := wk.vm.TickPeriod(); p != wk.period {
		wk.period = p
		select {
		case wk.tickWake <- struct{}{}:
		default:
		}
	}
	p := wk.pending
	wk.pending = nil
	return p
}

// broken answers a request whose VM trapped and replaces that VM, as Envoy
// discards a VM after a trap.
func (g *Gateway) broken(w http.ResponseWriter, wk *worker, err error) {
	g.log.Error("filter failed; replacing its VM", "err", err)
	wk.mu.Lock()
	if old := wk.vm; old.Broken() != nil {
		if vm, nerr := g.host.NewVM(context.Background()); nerr == nil {
			vm.OnCallout = func(c *wasmhost.Callout) { wk.pending = append(wk.pending, c) }
			wk.vm = vm
			// Its streams still in flight get its error from here on;
			// its memory (up to 4 GiB) goes, as Envoy drops a failed VM.
			_ = old.Close(context.Background())
		}
	}
	wk.mu.Unlock()
	writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "the filter failed")
}

// newRequestID is a random UUID-shaped id, as Envoy writes them. Like
// Envoy's (its random generator, not a cryptographic one) it names a
// request and guards nothing, so it costs no system call: math/rand/v2's
// generator is seeded by the runtime per thread.
func newRequestID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	hex.Encode(out[9:13], b[4:6])
	hex.Encode(out[14:18], b[6:8])
	hex.Encode(out[19:23], b[8:10])
	hex.Encode(out[24:36], b[10:16])
	out[8], out[13], out[18], out[23] = '-', '-', '-', '-'
	return string(out[:])
}

func requestHeaders(r *http.Request) wasmhost.Headers {
	h := make(wasmhost.Headers, 0, 4+len(r.Header)+2)
	h = append(h, [2]string{":method", r.Method}, [2]string{":path", r.URL.RequestURI()}, [2]string{":authority", r.Host}, [2]string{":scheme", scheme(r)})
	return appendHeaders(h, r.Header)
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

func writeLocal(w http.ResponseWriter, l *wasmhost.LocalResponse) {
	addHeaders(w.Header(), l.Headers)
	w.WriteHeader(l.Status)
	_, _ = w.Write(l.Body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`, code, msg)
}

func slogLevel(l wasmhost.LogLevel) slog.Level {
	switch {
	case l >= wasmhost.LogError:
		return slog.LevelError
	case l == wasmhost.LogWarn:
		return slog.LevelWarn
	case l == wasmhost.LogInfo:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// ParseCluster reads a -cluster flag value, NAME=URL.
func ParseCluster(s string) (string, *url.URL, error) {
	name, raw, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return "", nil, fmt.Errorf("cluster %q: want NAME=URL", s)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", nil, fmt.Errorf("cluster %q: %q is not an http(s) URL", name, raw)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil && !strings.Contains(err.Error(), "missing port") {
		return "", nil, fmt.Errorf("cluster %q: bad host %q", name, u.Host)
	}
	return name, u, nil
}
