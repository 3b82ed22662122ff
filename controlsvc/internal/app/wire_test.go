package app_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/windowtest"
)

// The decision route is served by a lean HTTP/1.1 path that hands every
// request it does not take whole to net/http (leanhttp). An attacker on the
// wire tries shapes the two could read differently: each row is written as
// raw bytes, and must get the status net/http would give, with no counter
// moved when it is refused.
func TestDecisionRouteOnTheWire(t *testing.T) {
	s := startService(t, "", nil)
	const victim = `{"user_id":"user:victim","endpoint":"/api/v1/items"}`
	auth := "Authorization: Bearer " + decisionToken + "\r\n"
	req := func(headers, body string) string {
		return "POST /v1/rate-limit/check HTTP/1.1\r\nHost: svc\r\n" + headers + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	for _, tc := range []struct {
		name   string
		raw    string
		status []int // statuses of the answers, in order
		moved  bool  // a counter may move
	}{
		{"plain check", req(auth, victim), []int{200}, true},
		{"bearer in lower case", req("authorization: bearer "+decisionToken+"\r\n", victim), []int{200}, true},
		{"credential twice", req(auth+auth, victim), []int{401}, false},
		{"credential folded onto a second line (net/http unfolds it)", req("Authorization: Bearer\r\n "+decisionToken+"\r\n", victim), []int{200}, true},
		{"NUL in a header", req(auth+"X-A: a\x00b\r\n", victim), []int{400}, false},
		{"two lengths", "POST /v1/rate-limit/check HTTP/1.1\r\nHost: svc\r\n" + auth + "Content-Length: 2\r\nContent-Length: " + strconv.Itoa(len(victim)) + "\r\n\r\n" + victim, []int{400}, false},
		// One parser reads a connection: net/http takes the chunked body
		// (empty: 400) and the check after it as the next request, where a
		// reader of the length would have seen one garbled request.
		{"length and chunked", "POST /v1/rate-limit/check HTTP/1.1\r\nHost: svc\r\n" + auth + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + req(auth, victim), []int{400, 200}, true},
		{"check, then an admin route without its token", req(auth, victim) + "POST /v1/rate-limit/reset HTTP/1.1\r\nHost: svc\r\n" + auth + "Content-Length: " + strconv.Itoa(len(victim)) + "\r\n\r\n" + victim, []int{200, 401}, true},
		{"10 kB request id", req(auth+"X-Request-Id: "+strings.Repeat("r", 10_000)+"\r\n", victim), []int{200}, true},
		{"body over max_body_bytes", req(auth, `{"pad":"`+strings.Repeat("a", 1<<20)+`"}`), []int{413}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Usage counts of earlier rows are written now, not during the row.
			if err := s.app.FlushUsage(context.Background()); err != nil {
				t.Fatal(err)
			}
			before := s.countersExcept("")
			c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			// The write may be cut short by a server that refuses early;
			// the answers tell.
			go func() { _, _ = io.WriteString(c, tc.raw) }()
			br := bufio.NewReader(c)
			for i, want := range tc.status {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != want {
					t.Fatalf("answer %d: %d %s, want %d", i, resp.StatusCode, truncate(body), want)
				}
			}
			if after := s.countersExcept(""); !tc.moved && after != before {
				t.Fatalf("a refused request moved counters:\n%s\n---\n%s", before, after)
			}
		})
	}
}

// The lean path answers as net/http did: the request id the caller sent
// comes back in the header and in a 429's body, and one is made up when it
// sent none.
func TestDecisionRouteRequestID(t *testing.T) {
	windowtest.RoomInMinute(t)
	s := startService(t, "", nil)
	body := `{"user_id":"user:rid","endpoint":"/x","strategy":"fixed_window","limit":1,"window_seconds":60}`
	r := s.do(http.MethodPost, "/v1/rate-limit/check", body, "X-Request-Id", "trace-1")
	if r.status != 200 || r.header.Get("X-Request-Id") != "trace-1" {
		t.Fatalf("%d, X-Request-Id %q", r.status, r.header.Get("X-Request-Id"))
	}
	r = s.do(http.MethodPost, "/v1/rate-limit/check", body)
	if r.status != 429 || len(r.header.Get("X-Request-Id")) != 32 {
		t.Fatalf("%d, X-Request-Id %q", r.status, r.header.Get("X-Request-Id"))
	}
	if got := r.json(t)["error"].(map[string]any)["request_id"]; got != r.header.Get("X-Request-Id") {
		t.Fatalf("body request_id %v, header %q", got, r.header.Get("X-Request-Id"))
	}
	// An id past 128 bytes, or not printable, is replaced on either path
	// (the lean one for the filter's checks, the checked one for the rest:
	// an outsider's 5 KB id came back in every answer and log line).
	for _, id := range []string{strings.Repeat("r", 129), "caf\xc3\xa9"} {
		for _, path := range []string{"/v1/rate-limit/check", "/v1/rate-limit/status/user:rid/x"} {
			method, b := http.MethodPost, any(body)
			if strings.Contains(path, "status") {
				method, b = http.MethodGet, nil
			}
			r := s.do(method, path, b, "X-Request-Id", id)
			if got := r.header.Get("X-Request-Id"); got == id || len(got) != 32 {
				t.Errorf("%s with a %d-byte id: X-Request-Id %.40q", path, len(id), got)
			}
		}
	}
}

// BenchmarkCheckOverTheWire is one check over a kept-alive connection, the
// way the filter's callouts arrive: written as bytes, answer read into a
// reused buffer, so allocs/op are the service's own (and the Redis
// client's), not the load generator's.
func BenchmarkCheckOverTheWire(b *testing.B) {
	// A limit no benchmark reaches: every answer is a 200.
	s := startService(b, "[[tiers]]\nname = \"free\"\nlimit = 1000000000\nwindow_seconds = 60\n", nil)
	body := `{"user_id":"user:bench","endpoint":"/api/v1/items"}`
	raw := []byte("POST /v1/rate-limit/check HTTP/1.1\r\nHost: svc\r\nAuthorization: Bearer " + decisionToken +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	first := func() *http.Response { // read with net/http once: it checks the framing
		if _, err := c.Write(raw); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("answer: %v %v", resp, err)
		}
		return resp
	}
	if _, err := io.ReadAll(first().Body); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(raw); err != nil {
			b.Fatal(err)
		}
		n := -1
		if line, err := br.ReadSlice('\n'); err != nil || !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
			b.Fatalf("answer %q %v", line, err)
		}
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				b.Fatal(err)
			}
			if len(line) == 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			}
		}
		if _, err := br.Discard(n); err != nil {
			b.Fatal(err)
		}
	}
}
