package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// errChunked: the raw reader knows Content-Length bodies only; a server
// answering otherwise is measured with Request instead.
var errChunked = errors.New("loadtest: raw mode reads Content-Length bodies only")

// maxRawBody bounds what one answer's body may claim.
const maxRawBody = 16 << 20

// runRaw is Run with Raw: each client holds one connection, writes a
// request, reads its answer, and dials again when the server closes it.
func runRaw(ctx context.Context, c Config) (Result, error) {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return Result{}, fmt.Errorf("loadtest: Addr %q: %w", c.Addr, err)
	}
	if !loopback(host) {
		return Result{}, ErrNotLoopback
	}
	// A client blocked in a read when MaxTime passes is woken by its
	// connection's deadline, MaxTime's (roundTrip).
	return drive(ctx, c, func() (roundTrip, func()) {
		var rc rawConn
		return func(ctx context.Context, i int64) (int, time.Duration, error) {
			t0 := time.Now()
			status, err := rc.roundTrip(ctx, c.Addr, c.Raw(i))
			switch {
			case errors.Is(err, errChunked):
				return 0, 0, fatal{err}
			case err != nil:
				rc.close()
				return 0, 0, err
			}
			return status, time.Since(t0), nil
		}, rc.close
	})
}

// rawConn is one client's connection, dialled when first needed.
type rawConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func (rc *rawConn) close() {
	if rc.conn != nil {
		rc.conn.Close()
		rc.conn = nil
	}
}

// roundTrip writes req and reads the answer's status; the body is read
// and dropped. The connection is closed when the answer says so.
func (rc *rawConn) roundTrip(ctx context.Context, addr string, req []byte) (int, error) {
	if rc.conn == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return 0, err
		}
		rc.conn = conn
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		if rc.r == nil {
			rc.r = bufio.NewReaderSize(conn, 4096)
		} else {
			rc.r.Reset(conn)
		}
	}
	if _, err := rc.conn.Write(req); err != nil {
		return 0, err
	}
	status, length, closing, err := readHead(rc.r)
	if err != nil {
		return 0, err
	}
	if _, err := rc.r.Discard(int(length)); err != nil {
		return 0, err
	}
	if closing {
		rc.close()
	}
	return status, nil
}

// readHead reads an answer's status line and header fields: its status,
// its Content-Length (0 when absent) and whether it closes the connection.
func readHead(r *bufio.Reader) (status int, length int64, closing bool, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, 0, false, fmt.Errorf("loadtest: bad status line %q", line)
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, 0, false, fmt.Errorf("loadtest: bad status line %q", line)
	}
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, 0, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return status, length, closing, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, 0, false, fmt.Errorf("loadtest: bad header line %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length, err = strconv.ParseInt(string(value), 10, 64)
			if err != nil || length < 0 || length > maxRawBody {
				return 0, 0, false, fmt.Errorf("loadtest: bad Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, 0, false, errChunked
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
}
