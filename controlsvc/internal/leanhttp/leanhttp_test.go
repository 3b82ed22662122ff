package leanhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

const route = "/v1/check"

// start runs a lean server on a loopback port: the lean route answers with
// "lean:" and the body, declining bodies that start with "decline"; the
// fallback answers "fallback:" with method, path and body.
func start(t *testing.T) (*Server, string) {
	t.Helper()
	return startTimeout(t, 5*time.Second)
}

// startTimeout is start with the given ReadHeaderTimeout (the fallback's
// stays 5 s).
func startTimeout(t *testing.T, readHeader time.Duration) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startOn(t, ln, readHeader)
}

// startOn is startTimeout on a listener of the test's.
func startOn(t *testing.T, ln net.Listener, readHeader time.Duration) (*Server, string) {
	t.Helper()
	fallback := &http.Server{ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			_, _ = io.WriteString(w, "fallback:"+r.Method+" "+r.URL.RequestURI()+" "+string(b))
		})}
	s := &Server{Path: route, Fallback: fallback, ReadHeaderTimeout: readHeader, IdleTimeout: time.Minute, BufferBytes: 1024,
		Handle: func(_ context.Context, r *Request, w *Response) bool {
			switch {
			case bytes.HasPrefix(r.Body, []byte("decline")):
				return false
			case bytes.HasPrefix(r.Body, []byte("panic")):
				panic("handler panicked")
			}
			w.HeaderInt("X-Authorizations", int64(r.Authorizations))
			w.Header("X-Request-Id", string(r.RequestID))
			w.Write(http.StatusOK, "text/plain", append([]byte("lean:"), r.Body...))
			return true
		}}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve returned %v", err)
		}
	})
	return s, ln.Addr().String()
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// roundTrip writes raw and reads one answer: its status and body.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	return readAnswer(t, br)
}

func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode < 200 { // 100 Continue
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func post(body string, extra ...string) string {
	return "POST " + route + " HTTP/1.1\r\nHost: svc\r\n" + strings.Join(extra, "") +
		"Content-Length: " + itoa(len(body)) + "\r\n\r\n" + body
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// TestRoutes: the plain shape is served lean; every other shape, whole, by
// the fallback, which then keeps the connection.
func TestRoutes(t *testing.T) {
	_, addr := start(t)
	tests := []struct {
		name, raw, want string
	}{
		{"plain check", post(`{"a":1}`), `lean:{"a":1}`},
		{"lower-case names, spaces around values", "POST " + route + " HTTP/1.1\r\nhost:  svc \r\ncontent-length: 2\r\n\r\nhi", "lean:hi"},
		{"empty body", post(""), "lean:"},
		{"other path", "POST /v1/other HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST /v1/other hi"},
		{"query", "POST " + route + "?x=1 HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST " + route + "?x=1 hi"},
		{"GET", "GET " + route + " HTTP/1.1\r\nHost: svc\r\n\r\n", "fallback:GET " + route + " "},
		{"lower-case method", "post " + route + " HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\n\r\nhi", "fallback:post " + route + " hi"},
		{"HTTP/1.0", "POST " + route + " HTTP/1.0\r\nHost: svc\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST " + route + " hi"},
		{"chunked", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", "fallback:POST " + route + " hi"},
		{"chunked and a length", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", "fallback:POST " + route + " hi"},
		{"two lengths", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi!", ""},
		{"signed length", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nContent-Length: +2\r\n\r\nhi", ""},
		{"no length", "POST " + route + " HTTP/1.1\r\nHost: svc\r\n\r\n", "fallback:POST " + route + " "},
		{"no Host", "POST " + route + " HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"two Hosts", "POST " + route + " HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"folded line", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST " + route + " hi"},
		{"space before colon", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nX-A : 1\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"brace in a name", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nX-{A}: 1\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"NUL in a value", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nhi", ""},
		{"bare LF line ending", "POST " + route + " HTTP/1.1\nHost: svc\nContent-Length: 2\n\nhi", "fallback:POST " + route + " hi"},
		{"Expect", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST " + route + " hi"},
		{"Connection: upgrade", "POST " + route + " HTTP/1.1\r\nHost: svc\r\nConnection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 2\r\n\r\nhi", "fallback:POST " + route + " hi"},
		{"head larger than the buffer", post("hi", "X-Big: "+strings.Repeat("a", 2000)+"\r\n"), "fallback:POST " + route + " hi"},
		{"body larger than the buffer", post(strings.Repeat("b", 1500)), "fallback:POST " + route + " " + strings.Repeat("b", 1500)},
		{"declined by the handler", post("decline me"), "fallback:POST " + route + " decline me"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, br := dial(t, addr)
			resp, body := roundTrip(t, c, br, tt.raw)
			if tt.want == "" {
				// net/http refuses it: the lean path must not have taken it.
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("status %d %q, want net/http's 400", resp.StatusCode, body)
				}
				return
			}
			if body != tt.want {
				t.Fatalf("answer %d %q, want %q", resp.StatusCode, body, tt.want)
			}
			if strings.HasPrefix(tt.want, "fallback:") && !resp.Close {
				// The fallback keeps the connection: even a plain check
				// after the handoff is its.
				if _, body := roundTrip(t, c, br, post("again")); body != "fallback:POST "+route+" again" {
					t.Fatalf("after the handoff: %q", body)
				}
			}
		})
	}
}

// TestKeepAliveAndPipelining: answers come in order on one connection,
// also when several requests arrive in one write.
func TestKeepAliveAndPipelining(t *testing.T) {
	_, addr := start(t)
	c, br := dial(t, addr)
	for i := range 3 {
		if _, body := roundTrip(t, c, br, post("n"+itoa(i))); body != "lean:n"+itoa(i) {
			t.Fatalf("request %d: %q", i, body)
		}
	}
	if _, err := io.WriteString(c, post("a")+post("b", "Authorization: x\r\nAuthorization: y\r\n")+post("c")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b", "c"} {
		resp, body := readAnswer(t, br)
		if body != "lean:"+want {
			t.Fatalf("pipelined answer %q, want lean:%s", body, want)
		}
		if want == "b" && resp.Header.Get("X-Authorizations") != "2" {
			t.Fatalf("two Authorization lines counted as %q", resp.Header.Get("X-Authorizations"))
		}
	}
}

// TestAnswerFraming: the answer is framed as net/http's is, and a value
// with a line break cannot split it.
func TestAnswerFraming(t *testing.T) {
	_, addr := start(t)
	c, br := dial(t, addr)
	resp, body := roundTrip(t, c, br, post("x", "X-Request-Id: abc\r\n"))
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(body)) || resp.Header.Get("Content-Type") != "text/plain" ||
		resp.Header.Get("Date") == "" || resp.Header.Get("X-Request-Id") != "abc" || resp.Close {
		t.Fatalf("answer %+v %q", resp, body)
	}
	var w Response
	w.Header("X-Evil", "a\r\nSet-Cookie: x=1")
	w.Write(200, "text/plain", nil)
	if bytes.Contains(w.buf, []byte("Set-Cookie")) {
		t.Fatalf("a CRLF value split the answer: %q", w.buf)
	}
}

// TestConnectionClose: a client that asks to close gets its answer, then
// the close.
func TestConnectionClose(t *testing.T) {
	_, addr := start(t)
	c, br := dial(t, addr)
	resp, body := roundTrip(t, c, br, post("bye", "Connection: close\r\n"))
	if body != "lean:bye" || !resp.Close {
		t.Fatalf("answer %q, close %v", body, resp.Close)
	}
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection still open: %v %v", n, err)
	}
}

// TestPanic: a handler's panic is a 500 that closes the connection; the
// server keeps serving others.
func TestPanic(t *testing.T) {
	_, addr := start(t)
	c, br := dial(t, addr)
	resp, body := roundTrip(t, c, br, post("panic"))
	if resp.StatusCode != 500 || !strings.Contains(body, "INTERNAL_ERROR") {
		t.Fatalf("answer %d %q", resp.StatusCode, body)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection not closed after a panic: %v", err)
	}
	c2, br2 := dial(t, addr)
	if _, body := roundTrip(t, c2, br2, post("ok")); body != "lean:ok" {
		t.Fatalf("after a panic: %q", body)
	}
}

// TestShutdownClosesIdle: Shutdown ends idle connections on both paths.
func TestShutdownClosesIdle(t *testing.T) {
	s, addr := start(t)
	lean, leanR := dial(t, addr)
	roundTrip(t, lean, leanR, post("x"))
	handed, handedR := dial(t, addr)
	roundTrip(t, handed, handedR, post("decline"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for name, br := range map[string]*bufio.Reader{"lean": leanR, "handed off": handedR} {
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s connection still open after Shutdown: %v", name, err)
		}
	}
}

// TestShutdownRightAfterAnAnswer: Shutdown that comes while a connection
// is between its answer and its next idle wait still ends it. The idle
// wait used to set its deadline after Shutdown had set its own, and then
// waited out the idle timeout (a minute here) while Shutdown's context ran
// out. The hook holds the connection right there until Shutdown has set
// its deadlines.
func TestShutdownRightAfterAnAnswer(t *testing.T) {
	reached, release := make(chan struct{}), make(chan struct{})
	waits := 0
	testHookBeforeIdle = func() {
		if waits++; waits == 2 { // the wait after the first answer
			close(reached)
			<-release
		}
	}
	t.Cleanup(func() { testHookBeforeIdle = nil })
	s, addr := start(t)
	c, br := dial(t, addr)
	roundTrip(t, c, br, post("x"))
	<-reached
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // a bound on a hang, not a speed target
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	for !s.closing.Load() {
		runtime.Gosched()
	}
	s.mu.Lock() // Shutdown sets the connections' deadlines holding it
	s.mu.Unlock()
	close(release)
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection still open after Shutdown: %v", err)
	}
}

// FuzzParseHead holds the lean parser to net/http's: whatever it takes,
// net/http reads as the same request (method, path, length, credentials).
func FuzzParseHead(f *testing.F) {
	f.Add(post(""))
	f.Add(post("", "Authorization: Bearer x\r\nX-Request-Id: r\r\n"))
	f.Add("POST " + route + " HTTP/1.1\r\nhost: a\r\ncontent-length: 0\r\nConnection: close\r\n\r\n")
	f.Add("POST " + route + " HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n")
	f.Fuzz(func(t *testing.T, head string) {
		i := strings.Index(head, "\r\n\r\n")
		if i < 0 {
			return
		}
		head = head[:i+4]
		var req Request
		n, close, ok := parseHead([]byte(head), route, &req)
		if !ok {
			return
		}
		hr, err := http.ReadRequest(bufio.NewReader(strings.NewReader(head + strings.Repeat("x", n))))
		if err != nil {
			t.Fatalf("lean took a head net/http refuses (%v): %q", err, head)
		}
		if hr.Method != http.MethodPost || hr.URL.RequestURI() != route || hr.ContentLength != int64(n) || hr.Close != close ||
			len(hr.Header.Values("Authorization")) != req.Authorizations || len(hr.TransferEncoding) != 0 {
			t.Fatalf("lean and net/http disagree on %q: %s %s len %d close %v auth %d", head, hr.Method, hr.URL, hr.ContentLength, hr.Close, len(hr.Header.Values("Authorization")))
		}
		if req.Authorizations > 0 && hr.Header.Values("Authorization")[req.Authorizations-1] != string(req.Authorization) {
			t.Fatalf("Authorization %q, net/http read %q", req.Authorization, hr.Header.Values("Authorization"))
		}
	})
}

// TestSilentConnectionIsClosed: a connection that never sends a byte is
// closed after ReadHeaderTimeout (5 s here), as net/http closes one, not
// kept for the idle timeout (a minute here): holding idle sockets open is
// cheap for an attacker and costly for the service. The client gives up
// after 10 s, so a server that waits the idle timeout fails the read with
// a timeout instead of the EOF awaited.
func TestSilentConnectionIsClosed(t *testing.T) {
	_, addr := start(t)
	_, br := dial(t, addr)
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("a silent connection: %v; want it closed (EOF)", err)
	}
}

// TestRequestCutShort: a request that starts and stops (a body shorter
// than its Content-Length, a head never finished) is answered 408 when
// ReadHeaderTimeout runs out, and the connection closed: handed to
// net/http, it held the connection for net/http's own timeouts too (35 s
// in all, found by an outsider's attack).
func TestRequestCutShort(t *testing.T) {
	_, addr := startTimeout(t, 300*time.Millisecond)
	for name, raw := range map[string]string{
		"body short of its length": "POST " + route + " HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789",
		"head never finished":      "POST " + route + " HTTP/1.1\r\nHost: x\r\nContent-Len",
	} {
		t.Run(name, func(t *testing.T) {
			c, br := dial(t, addr)
			if _, err := io.WriteString(c, raw); err != nil {
				t.Fatal(err)
			}
			resp, body := readAnswer(t, br)
			if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"code":"INVALID_INPUT"`) || !resp.Close {
				t.Fatalf("%d %q (close %v); want a 408 that closes the connection", resp.StatusCode, body, resp.Close)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("after the 408: %v; want the connection closed", err)
			}
		})
	}
}

// exhausted is a listener out of file descriptors for its first accepts.
type exhausted struct {
	net.Listener
	left int
}

func (l *exhausted) Accept() (net.Conn, error) {
	if l.left > 0 {
		l.left--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// Out of file descriptors (a flood of idle connections), the server waits
// and accepts again: it used to return the error, which ended the process
// (EMFILE is no timeout).
func TestAcceptRetriesWhenOutOfDescriptors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startOn(t, &exhausted{Listener: ln, left: 3}, 5*time.Second)
	c, br := dial(t, addr)
	if resp, body := roundTrip(t, c, br, post("x")); resp.StatusCode != http.StatusOK || body != "lean:x" {
		t.Fatalf("after failed accepts: %d %q", resp.StatusCode, body)
	}
}
