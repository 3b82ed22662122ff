package connlimit

import (
	"io"
	"net"
	"testing"
	"time"
)

// accepted serves l, sending each accepted connection on the channel.
func accepted(t *testing.T, l *Listener) chan net.Conn {
	out := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(out)
				return
			}
			out <- c
		}
	}()
	return out
}

// dial opens a connection to addr from the local address from ("" any).
func dial(t *testing.T, addr, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c (read sees EOF).
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

// One peer address holds at most its bound; another address still gets
// in; a closed connection gives its place back; the bound in all holds.
func TestBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, 2, 3)
	defer l.Close()
	conns := accepted(t, l)
	addr := ln.Addr().String()
	var held []net.Conn
	for range 2 {
		dial(t, addr, "127.0.0.1")
		held = append(held, <-conns)
	}
	third := dial(t, addr, "127.0.0.1")
	if !closedByServer(t, third) || l.Refused.Load() != 1 {
		t.Fatalf("a third connection from one address was kept (refused %d)", l.Refused.Load())
	}
	dial(t, addr, "127.0.0.2") // another peer: within the bound in all
	held = append(held, <-conns)
	if !closedByServer(t, dial(t, addr, "127.0.0.3")) || l.Refused.Load() != 2 || l.Open() != 3 {
		t.Fatalf("past the bound in all: refused %d, open %d", l.Refused.Load(), l.Open())
	}
	held[0].Close()
	held[0].Close() // twice: the place is given back once
	if l.Open() != 2 {
		t.Fatalf("open %d after a close, want 2", l.Open())
	}
	dial(t, addr, "127.0.0.1")
	select {
	case <-conns:
	case <-time.After(5 * time.Second):
		t.Fatal("the place a closed connection gave back was not taken")
	}
}

func TestDefaultTotal(t *testing.T) {
	if a, b := DefaultTotal(1), DefaultTotal(2); a < 16 || b < 16 || b > a {
		t.Fatalf("DefaultTotal(1) %d, (2) %d", a, b)
	}
}

// An IPv6 peer is counted by its /64: a host holds a whole /64.
func TestIPv6PeersByPrefix(t *testing.T) {
	a := peerOf(&fakeConn{addr: &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1")}})
	b := peerOf(&fakeConn{addr: &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9")}})
	c := peerOf(&fakeConn{addr: &net.TCPAddr{IP: net.ParseIP("2001:db8:1:3::1")}})
	v4 := peerOf(&fakeConn{addr: &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1")}})
	if a != b || a == c || v4.String() != "192.0.2.1" {
		t.Fatalf("%v %v %v %v", a, b, c, v4)
	}
}

type fakeConn struct {
	net.Conn
	addr net.Addr
}

func (f *fakeConn) RemoteAddr() net.Addr { return f.addr }

// On probation a connection not vouched for in time is closed; one vouched
// for stays.
func TestProbation(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, 8, 8)
	l.Probation(100 * time.Millisecond)
	defer l.Close()
	conns := accepted(t, l)
	idle := dial(t, ln.Addr().String(), "")
	<-conns
	kept := dial(t, ln.Addr().String(), "")
	l.Vouch((<-conns).RemoteAddr())
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("a connection never vouched for: %v, want closed", err)
	}
	kept.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := kept.Read(make([]byte, 1)); err == io.EOF {
		t.Fatal("a connection vouched for was closed")
	}
	if l.Refused.Load() != 1 || l.Open() != 1 {
		t.Fatalf("refused %d, open %d", l.Refused.Load(), l.Open())
	}
}
