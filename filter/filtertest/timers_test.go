package filtertest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Why the module must never arm a timer or start Go's poller: the poller,
// once started, polls (poll_oneoff) at every garbage collection
// (runtime.startTheWorldWithSema), and Envoy 1.33 to 1.38 answer poll_oneoff
// with ENOSYS, which Go's runtime treats as fatal. Adding the first timer
// starts the poller (runtime.(*timers).addHeap), even one stopped at once.
//
// forbidden are the ways code outside the runtime gets there, each with why.
var forbidden = map[string]string{
	"time.newTimer":                        "a timer (time.NewTimer, AfterFunc, After, Tick, context deadlines)",
	"time.Sleep":                           "a sleep, which waits on a timer",
	"crypto/internal/sysrand.Read":         "crypto/rand's first read arms a one-minute warning timer; use proxywasm.RandomBytes",
	"internal/poll.runtime_pollServerInit": "starts the poller",
	"internal/poll.runtime_pollOpen":       "registers a descriptor with the poller",
	"runtime.newproc":                      "a goroutine: it runs only when the callback's goroutine blocks, and needs the poller to sleep",
}

// deadEdges are calls the linker keeps but that never happen in the module,
// each with the reason, proven at run time by the soak's zero poll_oneoff.
// (None since the module stopped linking os: its standard files were the
// last, kept blocking under Envoy.)
var deadEdges = map[[2]string]string{}

// TestNothingArmsATimer reads the linker's reachability graph of the module
// (-ldflags=-dumpdep) and fails, naming the chain of calls, when anything
// the module can reach arms a timer, sleeps, starts a goroutine or starts
// the poller.
func TestNothingArmsATimer(t *testing.T) {
	g := moduleDeps(t)
	for edge := range deadEdges {
		if !g.has(edge[0], edge[1]) {
			t.Errorf("dead edge %s -> %s is gone: drop it from deadEdges", edge[0], edge[1])
		}
	}
	for target, why := range forbidden {
		if path := g.pathTo(target, deadEdges); path != nil {
			t.Errorf("the module reaches %s (%s):\n  %s", target, why, strings.Join(path, "\n  -> "))
		}
	}
}

// heavy are packages the module does without, each with why it would come
// back and what it cost: a symbol of any of them in the linker's graph
// fails the build of the test (the module's size, issue 26).
var heavy = map[string]string{
	"fmt.":           "fmt (with reflect): format with strconv, fielderr's own formatting",
	"encoding/json.": "encoding/json (with reflect): read JSON with wire.Reader, write it with wire's encoders",
	"math/big.":      "math/big (with fmt): crypto/rsa and crypto/ecdsa use it; sigverify checks signatures",
	"crypto/":        "the standard library's FIPS 140 module (AES, SHA-3, a DRBG): digest has SHA-256 and HMAC",
	"os.":            "os (and internal/poll, whose descriptors can start Go's poller): syscall.Getenv reads the environment",
	// 207 kB of the module with what it reaches: internal/godebug (which
	// only time imports here), internal/bisect, the runtime's metrics
	// tables, time's zones and formatter.
	"time.Time.": "package time: the filter keeps times as proxywasm.Time (Unix nanoseconds), jwt and breaker take int64 nanoseconds; wire.AppendRFC3339 writes the one time the filter sends",
	// 55 kB with their data.
	"internal/reflectlite.implements": "errors.As's reflection: fielderr.As unwraps by hand",
	// 22 kB: its tables of metrics and their descriptions.
	"runtime/metrics.": "runtime/metrics: the debug exports read runtime.ReadMemStats",
	// 20 kB: its trie and generic replacer.
	"strings.(*Replacer).": "strings.Replacer: rules.ValidateGlob replaces wildcards with a byte loop",
	// 23 kB with its data.
	"slices.pdqsortOrdered[go.shape.string]": "sorting strings with sort.Strings or slices.Sort: wire.sortKeys sorts its few map keys",
	// 13 kB with its encodings' tables, built at init.
	"encoding/base64.": "encoding/base64: jwt decodes base64url itself (base64URL, fuzzed against it)",
}

// TestModuleLinksNoHeavyPackage: none of heavy's packages is reachable in
// the module (about 2.5 MB of its size when they were).
func TestModuleLinksNoHeavyPackage(t *testing.T) {
	g := moduleDeps(t)
	for prefix, why := range heavy {
		for sym := range g {
			if strings.HasPrefix(sym, prefix) {
				t.Errorf("the module links %s: %s\n  %s", sym, why, strings.Join(g.pathTo(sym, deadEdges), "\n  -> "))
				break
			}
		}
	}
}

// maxModuleBytes is the shipped module's budget (issue 26: 3.5 MB, with
// no feature lost). What the module is made of: scripts/wasm-size.
const maxModuleBytes = 3_500_000

// TestModuleSize builds the module as make build ships it (no name
// section) and holds it to its budget.
func TestModuleSize(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "tollgate.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s", "-o", out, "..")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxModuleBytes {
		t.Errorf("the module is %d bytes, over its budget of %d: see what grew with make wasm-names and go run ./scripts/wasm-size -funcs 60 build/tollgate-names.wasm", fi.Size(), maxModuleBytes)
	}
	t.Logf("module: %d bytes (budget %d)", fi.Size(), maxModuleBytes)
}

var (
	depsOnce  sync.Once
	deps      depGraph
	depsError string
)

// moduleDeps builds the module once per test binary with -ldflags=-dumpdep
// (the suite runs once per WASI mode) and returns the graph.
func moduleDeps(t *testing.T) depGraph {
	depsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tollgate-deps")
		if err != nil {
			depsError = err.Error()
			return
		}
		defer os.RemoveAll(dir)
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-ldflags=-dumpdep", "-o", filepath.Join(dir, "m.wasm"), "..")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			depsError = "go build -ldflags=-dumpdep: " + err.Error() + "\n" + stderr.String()
			return
		}
		deps = parseDeps(&stderr)
		if len(deps) < 1000 {
			depsError = "the linker's dependency dump has " + strconv.Itoa(len(deps)) + " nodes: its format changed"
		}
	})
	if depsError != "" {
		t.Fatal(depsError)
	}
	return deps
}

// depGraph is the linker's reachability graph: symbol to the symbols it
// keeps alive.
type depGraph map[string][]string

// parseDeps reads -dumpdep output: "from -> to" lines, where a symbol may
// carry a " <UsedInIface>" style suffix.
func parseDeps(r *bytes.Buffer) depGraph {
	g := depGraph{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " -> ")
		if !ok {
			continue
		}
		from, _, _ = strings.Cut(from, " <")
		to, _, _ = strings.Cut(to, " <")
		g[from] = append(g[from], to)
	}
	return g
}

func (g depGraph) has(from, to string) bool {
	for _, n := range g[from] {
		if n == to {
			return true
		}
	}
	return false
}

// pathTo is the shortest chain from the module's roots ("_") to target that
// uses none of the dead edges and does not go through the runtime's own
// code (the runtime's own timers and goroutines, such as the scavenger's,
// are what the soak watches), or nil.
func (g depGraph) pathTo(target string, dead map[[2]string]string) []string {
	prev := map[string]string{"_": ""}
	queue := []string{"_"}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == target {
			var path []string
			for ; n != "_"; n = prev[n] {
				path = append([]string{n}, path...)
			}
			return path
		}
		if strings.HasPrefix(n, "runtime.") && n != target {
			continue
		}
		for _, m := range g[n] {
			if _, seen := prev[m]; seen {
				continue
			}
			if _, isDead := dead[[2]string{n, m}]; isDead {
				continue
			}
			prev[m] = n
			queue = append(queue, m)
		}
	}
	return nil
}

// The path finder itself, on small graphs: it must find what brings a timer
// in, name the chain, and honour dead edges and the runtime's own calls.
func TestPathTo(t *testing.T) {
	g := depGraph{
		"_":                            {"main.init", "runtime.main"},
		"main.init":                    {"leasecache.New", "os.init"},
		"leasecache.New":               {"crypto/rand.Read"},
		"crypto/rand.Read":             {"crypto/internal/sysrand.Read"},
		"crypto/internal/sysrand.Read": {"time.AfterFunc"},
		"time.AfterFunc":               {"time.newTimer"},
		"os.init":                      {"os.newFileFromNewFile"},
		"os.newFileFromNewFile":        {"internal/poll.runtime_pollServerInit"},
		"runtime.main":                 {"runtime.gcenable"},
		"runtime.gcenable":             {"runtime.newproc"},
	}
	dead := map[[2]string]string{{"os.init", "os.newFileFromNewFile"}: "test"}
	for _, c := range []struct {
		target string
		want   string
	}{
		{"time.newTimer", "main.init leasecache.New crypto/rand.Read crypto/internal/sysrand.Read time.AfterFunc time.newTimer"},
		{"internal/poll.runtime_pollServerInit", ""}, // only through a dead edge
		{"runtime.newproc", ""},                      // only from the runtime itself
		{"time.Sleep", ""},                           // not linked
	} {
		if got := strings.Join(g.pathTo(c.target, dead), " "); got != c.want {
			t.Errorf("pathTo(%s) = %q, want %q", c.target, got, c.want)
		}
	}
}
