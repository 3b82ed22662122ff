// Package connlimit bounds the connections a listener holds, per peer
// address and in all. Anyone who reaches a port can open connections and
// keep them idle: without a bound one source fills the process's file
// descriptors, and the service can then open no connection to Redis (and
// accepts no other proxy). A connection past a bound is accepted and
// closed at once, so it holds no descriptor and waits in no backlog.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Listener is a net.Listener that holds at most PerAddress connections
// from one peer address and Total in all.
type Listener struct {
	net.Listener
	perAddress, total int
	// Refused counts the connections closed at a bound.
	Refused atomic.Uint64

	mu    sync.Mutex
	open  int
	peers map[netip.Addr]int

	// probation, when set, is how long a connection may stay without being
	// vouched for (Vouch); conns finds a connection by its remote address.
	probation time.Duration
	conns     map[string]*conn
}

// Probation closes every connection not vouched for (Vouch) within d of
// its accept: a listener whose protocol keeps a connection that made no
// authorized call (gRPC keeps one idle for minutes) would otherwise let
// anyone hold it with a preface. Call it before serving.
func (l *Listener) Probation(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probation, l.conns = d, map[string]*conn{}
}

// Vouch keeps the connection from remote past its probation (an
// authorized call came on it).
func (l *Listener) Vouch(remote net.Addr) {
	l.mu.Lock()
	c := l.conns[remote.String()]
	l.mu.Unlock()
	if c != nil {
		c.vouched.Store(true)
	}
}

// New bounds ln's connections: perAddress from one peer address, total in
// all (each at least 1).
func New(ln net.Listener, perAddress, total int) *Listener {
	return &Listener{Listener: ln, perAddress: max(perAddress, 1), total: max(total, 1), peers: map[netip.Addr]int{}}
}

// Accept returns the next connection within the bounds.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(c)
		if l.take(peer) {
			cc := &conn{Conn: c, l: l, peer: peer}
			l.watch(cc)
			return cc, nil
		}
		l.Refused.Add(1)
		c.Close()
	}
}

func (l *Listener) take(peer netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.total || l.peers[peer] >= l.perAddress {
		return false
	}
	l.open++
	l.peers[peer]++
	return true
}

// watch starts a connection's probation, if the listener has one.
func (l *Listener) watch(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.probation <= 0 {
		return
	}
	l.conns[c.RemoteAddr().String()] = c
	c.timer = time.AfterFunc(l.probation, func() {
		if !c.vouched.Load() {
			l.Refused.Add(1)
			c.Close()
		}
	})
}

func (l *Listener) give(c *conn) {
	peer := c.peer
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns != nil && l.conns[c.RemoteAddr().String()] == c {
		delete(l.conns, c.RemoteAddr().String())
	}
	l.open--
	if l.peers[peer]--; l.peers[peer] <= 0 {
		delete(l.peers, peer)
	}
}

// Open is the count of connections held.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// peerOf is a connection's peer address: IPv4-mapped addresses as IPv4,
// IPv6 ones by their /64 (one host is routinely given a whole /64, and
// would otherwise have 2^64 bounds); the zero Addr for a peer of another
// kind, which then share one count.
func peerOf(c net.Conn) netip.Addr {
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip, _ := netip.AddrFromSlice(a.IP)
	if ip = ip.Unmap(); ip.Is6() {
		ip = netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return ip
}

type conn struct {
	net.Conn
	l       *Listener
	peer    netip.Addr
	closed  atomic.Bool
	vouched atomic.Bool
	timer   *time.Timer // its probation (nil: none); set under l.mu
}

// Close closes the connection and gives its place back, once.
func (c *conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.mu.Lock()
		t := c.timer
		c.l.mu.Unlock()
		if t != nil {
			t.Stop()
		}
		defer c.l.give(c)
	}
	return c.Conn.Close()
}

// DefaultTotal is the bound in all for each of n listeners: together at
// most three quarters of the process's file descriptors, the rest left
// for Redis, files and the runtime.
func DefaultTotal(n int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 1024
	}
	return max(16, int(min(r.Cur, 1<<30)*3/4)/max(n, 1))
}
