// Package redistest starts real Redis processes for tests: a single server, a
// sentinel watching one, or a small cluster, each on a free loopback port with
// persistence off, stopped when the test ends. It is the one place every
// module's tests get Redis from. A missing binary fails the test with a message
// saying how to install it; nothing is skipped.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long a process may take to say it is ready.
const StartTimeout = 15 * time.Second

// Server is one running redis-server or redis-sentinel.
type Server struct {
	Addr string // 127.0.0.1:<port>
	Port int

	tb   testing.TB
	bin  string
	args []string
	dir  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *lockedBuffer
}

// Start runs a redis-server on a free loopback port. Extra arguments are
// appended to the command line ("--maxmemory", "1mb", ...).
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	return start(tb, "redis-server", "Ready to accept connections", extra)
}

// StartSentinel runs a redis-sentinel that monitors master under name, and
// returns once the sentinel reports that it monitors it.
func StartSentinel(tb testing.TB, master *Server, name string) *Server {
	tb.Helper()
	return start(tb, "redis-sentinel", "+monitor master "+name, nil, func(dir string, port int) []string {
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
			port, name, master.Port, name, name)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			tb.Fatalf("redistest: write sentinel config: %v", err)
		}
		return []string{conf}
	})
}

// StartCluster runs n redis-server nodes in cluster mode, spreads the 16384
// slots over them, and returns once every node reports cluster_state:ok.
func StartCluster(tb testing.TB, n int) []*Server {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("redistest: a cluster needs at least one node")
	}
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = start(tb, "redis-server", "Ready to accept connections",
			[]string{"--cluster-enabled", "yes", "--cluster-node-timeout", "2000"},
			func(dir string, _ int) []string {
				return []string{"--cluster-config-file", filepath.Join(dir, "nodes.conf")}
			})
	}
	per := 16384 / n
	for i, node := range nodes {
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if _, err := Do(node.Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			tb.Fatalf("redistest: assign slots %d-%d to %s: %v", lo, hi, node.Addr, err)
		}
		if i > 0 {
			if _, err := Do(node.Addr, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(nodes[0].Port)); err != nil {
				tb.Fatalf("redistest: cluster meet: %v", err)
			}
		}
	}
	// Gossip has no event to wait on from outside; poll the state the nodes
	// publish, bounded by StartTimeout.
	deadline := time.Now().Add(StartTimeout)
	for _, node := range nodes {
		for {
			info, err := Do(node.Addr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(fmt.Sprint(info), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redistest: cluster did not become ok within %v: %v %v", StartTimeout, info, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nodes
}

type argsFunc func(dir string, port int) []string

func start(tb testing.TB, bin, ready string, extra []string, more ...argsFunc) *Server {
	tb.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		tb.Fatalf("redistest: %s is not installed (%v); run 'make deps' or 'apt-get install -y redis-server redis-sentinel redis-tools'", bin, err)
	}
	dir := tb.TempDir()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatalf("redistest: find a free port: %v", err)
		}
		var args []string
		for _, f := range more {
			args = append(args, f(dir, port)...)
		}
		args = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", dir, "--logfile", "", "--protected-mode", "no")
		args = append(args, extra...)
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Port: port, tb: tb, bin: path, args: args, dir: dir}
		if lastErr = s.run(ready); lastErr == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("redistest: %s did not start: %v", bin, lastErr)
	return nil
}

// run starts the process and waits for its ready line on stdout.
func (s *Server) run(ready string) error {
	cmd := exec.Command(s.bin, s.args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	log := &lockedBuffer{}
	readyCh := make(chan struct{})
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			log.WriteLine(line)
			if !signalled && strings.Contains(line, ready) {
				signalled = true
				close(readyCh)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-readyCh:
	case <-done:
		return fmt.Errorf("exited before ready: %s", log.Tail(5))
	case <-time.After(StartTimeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("not ready within %v: %s", StartTimeout, log.Tail(5))
	}
	s.mu.Lock()
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()
	return nil
}

// Stop kills the process and waits for it to exit. Stopping twice is fine.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Freeze stops the process (SIGSTOP) until Thaw: it keeps its port and
// accepted connections and answers nothing, as a hung host or a black-holed
// network does.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw lets a frozen process run again (SIGCONT).
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart starts a stopped server again on the same port, for tests of
// recovery after an outage. Data is not kept (persistence is off).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	ready := "Ready to accept connections"
	if strings.HasSuffix(s.bin, "redis-sentinel") {
		ready = "+monitor master"
	}
	if err := s.run(ready); err != nil {
		s.tb.Fatalf("redistest: restart %s on %s: %v", filepath.Base(s.bin), s.Addr, err)
	}
}

// Log returns the last lines the process wrote, for failure messages.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.Tail(20)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

type lockedBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *lockedBuffer) WriteLine(l string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, l)
	if len(b.lines) > 200 {
		b.lines = b.lines[len(b.lines)-100:]
	}
}

func (b *lockedBuffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	from := max(0, len(b.lines)-n)
	return strings.Join(b.lines[from:], "\n")
}
