// Package leanhttp serves one hot route over HTTP/1.1 keep-alive without
// net/http's per-request machinery. For every request net/http starts a
// background read to notice a client that goes away, makes a context, a
// header map and a response value, and canonicalises every header name;
// for a decision that is answered in a few microseconds that machinery was
// half of the service's CPU.
//
// It takes only the plain shape of its route: a POST to one exact path,
// HTTP/1.1, one Host, a Content-Length body that fits in its read buffer,
// and header lines made of token names and visible values. Any other
// request, and every request after it on that connection, is handed whole
// (connection and every byte read so far) to a net/http server: nothing
// unusual (chunked bodies, Expect, upgrades, obsolete line folding, odd
// bytes) is parsed here, and the handler can also decline a request it
// would rather see answered by the general path (a refused credential, an
// odd body), as long as it has done nothing yet.
package leanhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-rl/tollgate/shared/wire"
)

// Request is what the route's handler gets: slices into the connection's
// read buffer, valid until the handler returns.
type Request struct {
	// Authorization is the value of the Authorization header;
	// Authorizations counts the header's lines (0: absent).
	Authorization  []byte
	Authorizations int
	// RequestID is the X-Request-Id the client sent (nil: none).
	RequestID []byte
	Body      []byte
}

// Handler answers the route. It returns false, having written nothing and
// changed nothing, to hand the request to the fallback server instead.
type Handler func(ctx context.Context, r *Request, w *Response) bool

// Server serves Path with Handle and everything else with Fallback.
type Server struct {
	Path     string
	Handle   Handler
	Fallback *http.Server
	Log      *slog.Logger
	// BufferBytes bounds a request (head and body) the lean path takes;
	// a larger one goes to Fallback, which applies its own limits.
	BufferBytes int
	// ReadHeaderTimeout bounds the wait for a request once its first byte
	// arrived; IdleTimeout the wait for the next request on a connection.
	ReadHeaderTimeout, IdleTimeout time.Duration

	handoff  handoffListener
	mu       sync.Mutex
	ln       net.Listener
	conns    map[*conn]struct{}
	closing  atomic.Bool
	wg       sync.WaitGroup
	initOnce sync.Once
}

func (s *Server) init() {
	s.initOnce.Do(func() {
		s.handoff = handoffListener{conns: make(chan net.Conn), done: make(chan struct{})}
		s.conns = map[*conn]struct{}{}
		if s.BufferBytes <= 0 {
			s.BufferBytes = 8 << 10
		}
		if s.Log == nil {
			s.Log = slog.Default()
		}
	})
}

// ErrServerClosed is what Serve returns after Shutdown.
var ErrServerClosed = http.ErrServerClosed

// Serve accepts connections on ln until Shutdown (then ErrServerClosed) or
// a listener error.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	s.handoff.addr = ln.Addr()
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	fallbackDone := make(chan error, 1)
	go func() { fallbackDone <- s.Fallback.Serve(&s.handoff) }()
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors (EMFILE, which is no timeout) and
			// the like: back off, up to a second, and accept again once
			// connections close. Returning would end the process: a
			// flood of idle connections from anyone who can reach the
			// port would switch limiting off.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.Log.Warn("accept failed; retrying", "err", err, "in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		cc := &conn{Conn: c, s: s}
		if !s.track(cc) {
			c.Close()
			return ErrServerClosed
		}
		go cc.serve()
	}
}

func (s *Server) track(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.wg.Done()
}

// Shutdown stops accepting, closes idle connections, lets requests in
// flight finish (each connection closes after its answer), and shuts the
// fallback server down the same way, all within ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.init()
	s.closing.Store(true)
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		// A connection waiting for its next request wakes up and ends; one
		// in a request ends after answering it.
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	err := s.Fallback.Shutdown(ctx)
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

// testHookBeforeIdle, when set, runs as a connection starts waiting for
// its next request (a test holds it there to meet Shutdown).
var testHookBeforeIdle func()

// conn is one client connection on the lean path.
type conn struct {
	net.Conn
	s    *Server
	br   *bufio.Reader
	resp Response
}

func (c *conn) serve() {
	handedOff := false
	defer func() {
		if !handedOff {
			c.Close()
		}
		c.s.untrack(c)
	}()
	c.br = bufio.NewReaderSize(c.Conn, c.s.BufferBytes)
	ctx := context.Background()
	for first := true; !c.s.closing.Load(); first = false {
		if testHookBeforeIdle != nil {
			testHookBeforeIdle()
		}
		// A new connection gets ReadHeaderTimeout for its first byte, as
		// net/http gives it: one that never sends a byte must not hold a
		// connection for the idle timeout.
		wait := c.s.IdleTimeout
		if first && c.s.ReadHeaderTimeout > 0 {
			wait = c.s.ReadHeaderTimeout
		}
		if wait > 0 {
			_ = c.SetReadDeadline(time.Now().Add(wait))
			if c.s.closing.Load() {
				// Shutdown may have set its past deadline between the
				// loop's check and ours, which replaced it: the wait
				// would last the idle timeout, beyond Shutdown's context.
				// If Shutdown comes after this check, its deadline is
				// set after ours and wins.
				_ = c.SetReadDeadline(time.Unix(1, 0))
			}
		}
		if _, err := c.br.Peek(1); err != nil {
			return // closed, idle too long, or shutting down
		}
		req, n, ok, late := c.readRequest()
		if late {
			// The request began and stopped (a body shorter than its
			// Content-Length, a head never finished) for the whole
			// ReadHeaderTimeout: answered here, not handed to net/http,
			// which would wait its own read timeout again.
			_, _ = c.Write([]byte(requestTimeout))
			return
		}
		if !ok {
			handedOff = c.handOff()
			return
		}
		keep, answered := c.answer(ctx, &req)
		if !answered {
			handedOff = c.handOff()
			return
		}
		if _, err := c.Write(c.resp.buf); err != nil || !keep {
			return
		}
		if _, err := c.br.Discard(n); err != nil {
			return
		}
	}
}

// answer runs the handler, recovering a panic as a 500 that closes the
// connection (what net/http and echo's Recover together do).
func (c *conn) answer(ctx context.Context, req *Request) (keep, answered bool) {
	defer func() {
		if p := recover(); p != nil {
			c.s.Log.Error("panic in the lean route", "panic", p)
			c.resp.reset()
			c.resp.Write(http.StatusInternalServerError, "application/json", []byte(`{"error":{"code":"INTERNAL_ERROR","message":"internal error","details":{}}}`))
			keep, answered = false, true
		}
	}()
	c.resp.reset()
	if !c.s.Handle(ctx, req, &c.resp) {
		return false, false
	}
	if c.resp.buf == nil {
		panic("leanhttp: the handler answered without writing")
	}
	return !c.resp.close, true
}

// timedOut reports whether a read failed at its deadline.
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// requestTimeout is the answer to a request that stopped arriving: 408,
// with the API's error envelope.
var requestTimeout = func() string {
	body := wire.AppendErrorEnvelope(nil, &wire.ErrorBody{Code: wire.CodeInvalidInput,
		Message: "the request stopped arriving before its end", Details: map[string]any{"field": "body"}})
	return "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)
}()

// readRequest parses the request at the head of the read buffer without
// consuming it: the request and the number of bytes it spans, or ok=false
// when it is not the lean route's plain shape (or does not fit); late is
// true when the request stopped arriving before the read deadline.
func (c *conn) readRequest() (req Request, n int, ok, late bool) {
	if c.s.ReadHeaderTimeout > 0 {
		_ = c.SetReadDeadline(time.Now().Add(c.s.ReadHeaderTimeout))
	}
	var head []byte
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if n := headEnd(buf); n > 0 {
			head = buf[:n]
			break
		}
		if c.br.Buffered() >= c.br.Size() {
			return req, 0, false, false // too large for the lean path
		}
		if _, err := c.br.Peek(c.br.Buffered() + 1); err != nil {
			return req, 0, false, timedOut(err) // else let net/http say what went wrong
		}
	}
	cl, close, ok := parseHead(head, c.s.Path, &req)
	if !ok || len(head)+cl > c.br.Size() {
		return req, 0, false, false
	}
	all, err := c.br.Peek(len(head) + cl)
	if err != nil {
		return req, 0, false, timedOut(err)
	}
	req.Body = all[len(head):]
	c.resp.close = close
	return req, len(all), true, false
}

// headEnd is the length of the head at the start of buf, through its
// blank line (0: not all there yet). A blank line ended by a bare LF counts
// too, so that such a head is handed on at once (parseHead refuses it)
// rather than waited on.
func headEnd(buf []byte) int {
	for i := bytes.IndexByte(buf, '\n'); i >= 0 && i+1 < len(buf); {
		switch {
		case buf[i+1] == '\n':
			return i + 2
		case buf[i+1] == '\r' && i+2 < len(buf) && buf[i+2] == '\n':
			return i + 3
		}
		j := bytes.IndexByte(buf[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return 0
}

// parseHead reads a request head (request line through the blank line). It
// accepts only what it can read without doubt; ok=false otherwise.
func parseHead(head []byte, path string, req *Request) (contentLength int, close, ok bool) {
	if !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		return 0, false, false // bare LF line endings
	}
	line, rest, _ := bytes.Cut(head, crlf)
	if len(line) != len("POST ")+len(path)+len(" HTTP/1.1") || string(line[:5]) != "POST " ||
		string(line[5:5+len(path)]) != path || string(line[5+len(path):]) != " HTTP/1.1" {
		return 0, false, false
	}
	hosts, lengths := 0, 0
	contentLength = -1
	for len(rest) > 2 { // the head ends with the blank line's CRLF
		line, rest, _ = bytes.Cut(rest, crlf)
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return 0, false, false
		}
		name, value := line[:colon], trimOWS(line[colon+1:])
		if !isFieldValue(value) {
			return 0, false, false
		}
		switch {
		case wire.EqualFoldASCII(name, "content-length"):
			lengths++
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 || !allDigits(value) {
				return 0, false, false
			}
			contentLength = n
		case wire.EqualFoldASCII(name, "host"):
			hosts++
		case wire.EqualFoldASCII(name, "authorization"):
			req.Authorizations++
			req.Authorization = value
		case wire.EqualFoldASCII(name, "x-request-id"):
			req.RequestID = value
		case wire.EqualFoldASCII(name, "connection"):
			switch {
			case wire.EqualFoldASCII(value, "close"):
				close = true
			case wire.EqualFoldASCII(value, "keep-alive"):
			default:
				return 0, false, false // upgrades and hop-by-hop lists
			}
		case wire.EqualFoldASCII(name, "transfer-encoding"), wire.EqualFoldASCII(name, "expect"), wire.EqualFoldASCII(name, "upgrade"),
			wire.EqualFoldASCII(name, "trailer"), wire.EqualFoldASCII(name, "te"):
			return 0, false, false
		}
	}
	if hosts != 1 || lengths != 1 || contentLength < 0 {
		return 0, false, false
	}
	return contentLength, close, true
}

var crlf = []byte("\r\n")

// isToken is RFC 9110's token: the characters a header name may have.
func isToken(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 || !tokenChars[c] {
			return false
		}
	}
	return true
}

var tokenChars = func() (t [128]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// isFieldValue refuses control characters (but tab) and DEL; obs-text
// (bytes ≥ 0x80) passes, as it does in net/http.
func isFieldValue(b []byte) bool {
	for _, c := range b {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0 && len(b) <= 9
}

// handOff gives the connection, with what has been read and not consumed,
// to the fallback server. It reports whether the fallback took it.
func (c *conn) handOff() bool {
	_ = c.SetReadDeadline(time.Time{}) // net/http sets its own
	select {
	case c.s.handoff.conns <- &handedConn{Conn: c.Conn, r: c.br}:
		return true
	case <-c.s.handoff.done:
		return false
	}
}

// handedConn reads what the lean path buffered before the socket.
type handedConn struct {
	net.Conn
	r *bufio.Reader
}

func (h *handedConn) Read(p []byte) (int, error) { return h.r.Read(p) }

// handoffListener is the fallback server's listener: it accepts the
// connections the lean path hands over.
type handoffListener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	addr      net.Addr
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }
