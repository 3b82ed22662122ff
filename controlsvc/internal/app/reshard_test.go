package app_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

// Resharding a cluster under load: the slot holding a busy caller's counter
// moves to another node (as redis-cli --cluster reshard moves it: IMPORTING
// and MIGRATING, the keys MIGRATEd, the slot handed over) while checks of
// that caller run. Every check is decided by the counter, wherever it is
// at that moment: exactly the limit admitted, nothing degraded, no error.
// With penalties on, the script names the caller's penalty and block keys
// too, which do not exist: the node importing the slot answers TRYAGAIN
// to a script whose keys it does not all hold. Callers on other slots of
// the same node share the moving caller's pipelines meanwhile, and are
// counted exactly too: once a check (go-redis sent a node's whole part of
// a pipeline again when its first answer was TRYAGAIN, and scripts that
// had run counted their callers up to four times: attack 46 B1).
func TestClusterReshardUnderLoad(t *testing.T) {
	const penalties = "[penalties]\nenabled = true\n"
	for _, tc := range []struct {
		name, toml string
		split      bool // the nodes answer TRYAGAIN while the slot moves
		long       bool // longer than the retries: the mover's checks fail
	}{
		{"one key a check", "", false, false},
		{"penalty keys named too", penalties, true, false},
		{"a move longer than the retries", penalties, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) { reshardUnderLoad(t, tc.toml, tc.split, tc.long) })
	}
}

// A move longer than the retries leaves the moving slot's callers to the
// failure mode meanwhile, and only them: the breaker, which would send
// every caller there, does not count a node's TRYAGAIN against Redis (it
// did: a 0.9 s move answered 679 of 2,654 other callers' checks degraded,
// attack 47 A1).
func reshardUnderLoad(t *testing.T, toml string, split, long bool) {
	nodes := redistest.StartCluster(t, 3)
	s := startServiceOn(t, nil, "redis-cluster://"+nodes[0].Addr+","+nodes[1].Addr, toml, nil)
	const limit, workers, each = 150, 6, 50
	req := map[string]any{"user_id": "reshard", "endpoint": "/x", "limit": limit, "window_seconds": 3600, "strategy": "token_bucket"}
	if r := s.check(req); r.status != 200 {
		t.Fatalf("first check: %d %s", r.status, r.body)
	}
	src, slot := findOwnerSlot(t, nodes, "reshard")
	dst := nodes[(src+1)%len(nodes)]
	bystanders := callersOn(t, nodes[src], 8)

	var done, moverDegraded, bystanderDegraded atomic.Int64
	codes := make(chan string, workers*each)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	sent := make([]int, len(bystanders))
	// A fixed window counts every check: what a bystander's counter says
	// is what it was counted (unless an hour began during the test).
	hour := time.Now().Unix() / 3600
	for i, id := range bystanders {
		untilStopped(stop, &wg, func() bool {
			r, err := s.tryDo("POST", "/v1/rate-limit/check", map[string]any{"user_id": id, "endpoint": "/y", "limit": 1_000_000, "window_seconds": 3600, "strategy": "fixed_window"})
			if err != nil || r.status != 200 {
				t.Errorf("bystander %s: %v %v", id, r, err)
				return false
			}
			if strings.Contains(string(r.body), `"degraded"`) {
				bystanderDegraded.Add(1)
			}
			// A paced caller (400 checks a second in all), as most are: a
			// busy one's successes between the mover's failures would keep
			// the breaker from opening whatever it counted.
			time.Sleep(20 * time.Millisecond)
			sent[i]++
			return true
		})
	}
	var moving sync.WaitGroup
	for range workers {
		moving.Add(1)
		go func() {
			defer moving.Done()
			for range each {
				r, err := s.tryDo("POST", "/v1/rate-limit/check", req)
				switch {
				case err != nil:
					codes <- "error: " + err.Error()
				case strings.Contains(string(r.body), `"degraded"`):
					moverDegraded.Add(1)
					codes <- fmt.Sprintf("%d degraded", r.status)
				default:
					codes <- strconv.Itoa(r.status)
				}
				done.Add(1)
			}
		}()
	}
	// Each step of the move waits for checks to go on meanwhile, and, once
	// the caller's keys are split, for a node to have answered TRYAGAIN:
	// the checks met the move (bounded waits: checks that hang or never
	// meet it are failures the counts below show).
	progress := func(n int64) {
		target := done.Load() + n
		for deadline := time.Now().Add(10 * time.Second); done.Load() < target && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	tryAgains := func() int {
		n := 0
		for _, node := range nodes {
			info, _ := redistest.Do(node.Addr, "INFO", "errorstats")
			_, after, ok := strings.Cut(fmt.Sprint(info), "errorstat_TRYAGAIN:count=")
			if ok {
				v, _ := strconv.Atoi(strings.TrimSpace(strings.FieldsFunc(after, func(r rune) bool { return r < '0' || r > '9' })[0]))
				n += v
			}
		}
		return n
	}
	awaitTryAgain := func() {
		before := tryAgains()
		for deadline := time.Now().Add(10 * time.Second); tryAgains() == before && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	progress(30)
	srcID, dstID := nodeID(t, nodes[src]), nodeID(t, dst)
	slotArg := strconv.Itoa(slot)
	mustDo(t, dst.Addr, "CLUSTER", "SETSLOT", slotArg, "IMPORTING", srcID)
	mustDo(t, nodes[src].Addr, "CLUSTER", "SETSLOT", slotArg, "MIGRATING", dstID)
	switch {
	case long:
		// Hold the split until every mover's check has run out of retries
		// once.
		for deadline := time.Now().Add(10 * time.Second); moverDegraded.Load() < workers; {
			if time.Now().After(deadline) {
				t.Fatalf("the mover's checks never ran out of retries: %d degraded", moverDegraded.Load())
			}
			time.Sleep(time.Millisecond)
		}
	case split:
		awaitTryAgain()
	default:
		progress(30)
	}
	keys, err := redistest.Do(nodes[src].Addr, "CLUSTER", "GETKEYSINSLOT", slotArg, "100")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys.([]any) {
		mustDo(t, nodes[src].Addr, "MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port), "", "0", "5000", "KEYS", fmt.Sprint(k))
		if split {
			awaitTryAgain()
		} else {
			progress(20)
		}
	}
	for _, n := range []*redistest.Server{dst, nodes[src], nodes[(src+2)%len(nodes)]} {
		mustDo(t, n.Addr, "CLUSTER", "SETSLOT", slotArg, "NODE", dstID)
	}
	if n := tryAgains(); split && n == 0 {
		t.Fatal("no node answered TRYAGAIN: the checks never met the slot split")
	} else {
		t.Logf("%d checks done at the handover, %d TRYAGAIN answers", done.Load(), n)
	}
	moving.Wait()
	close(stop)
	wg.Wait()
	close(codes)
	if n := bystanderDegraded.Load(); n > 0 {
		t.Errorf("%d checks of callers on other slots were answered degraded while one slot moved", n)
	}
	for i, id := range bystanders {
		if time.Now().Unix()/3600 != hour {
			t.Log("an hour began during the test: its fixed windows were not compared")
			break
		}
		r := s.check(map[string]any{"user_id": id, "endpoint": "/y", "limit": 1_000_000, "window_seconds": 3600, "strategy": "fixed_window"})
		if counted := 1_000_000 - int(r.json(t)["remaining"].(float64)); counted != sent[i]+1 {
			t.Errorf("bystander %s on the moving slot's node: %d checks counted %d times", id, sent[i]+1, counted)
		}
	}
	got := map[string]int{}
	for c := range codes {
		got[c]++
	}
	if long {
		// The mover's checks in the failure mode meanwhile: fail_open,
		// degraded; the others counted.
		if got["200"] > limit-1 || got["200 degraded"]+got["429 degraded"] < workers {
			t.Fatalf("checks while the slot moved too long: %v", got)
		}
		return
	}
	// The first check spent one token.
	if got["200"] != limit-1 || got["429"] != workers*each-(limit-1) {
		t.Fatalf("checks while the slot moved: %v; want %d allowed and %d denied, nothing else\n%s", got, limit-1, workers*each-(limit-1), s.logs)
	}
	if n, _ := redistest.Do(dst.Addr, "CLUSTER", "COUNTKEYSINSLOT", slotArg); fmt.Sprint(n) == "0" {
		t.Fatalf("the caller's keys did not move to %s", dst.Addr)
	}
}

// untilStopped runs step over and over in a goroutine of wg, until stop
// is closed or step says no more.
func untilStopped(stop <-chan struct{}, wg *sync.WaitGroup, step func() bool) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !step() {
				return
			}
		}
	}()
}

// callersOn is n user ids whose counters live on node (the slots it serves).
func callersOn(t *testing.T, node *redistest.Server, n int) []string {
	t.Helper()
	slots, err := redistest.Do(node.Addr, "CLUSTER", "SLOTS")
	if err != nil {
		t.Fatal(err)
	}
	owns := func(slot int) bool {
		for _, r := range slots.([]any) {
			e := r.([]any)
			lo, _ := strconv.Atoi(fmt.Sprint(e[0]))
			hi, _ := strconv.Atoi(fmt.Sprint(e[1]))
			if slot >= lo && slot <= hi && fmt.Sprint(e[2].([]any)[1]) == strconv.Itoa(node.Port) {
				return true
			}
		}
		return false
	}
	var ids []string
	for i := 0; len(ids) < n && i < 10_000; i++ {
		id := "bystander" + strconv.Itoa(i)
		v, err := redistest.Do(node.Addr, "CLUSTER", "KEYSLOT", "{identity:user:"+id+"}")
		if err != nil {
			t.Fatal(err)
		}
		if slot, _ := strconv.Atoi(fmt.Sprint(v)); owns(slot) {
			ids = append(ids, id)
		}
	}
	return ids
}

// findOwnerSlot is the node holding the caller's counter and its slot.
func findOwnerSlot(t *testing.T, nodes []*redistest.Server, id string) (int, int) {
	t.Helper()
	for i, n := range nodes {
		ks, err := redistest.Do(n.Addr, "KEYS", "*"+id+"*")
		if err != nil {
			t.Fatal(err)
		}
		if l, _ := ks.([]any); len(l) > 0 {
			slot, err := redistest.Do(n.Addr, "CLUSTER", "KEYSLOT", fmt.Sprint(l[0]))
			if err != nil {
				t.Fatal(err)
			}
			v, _ := strconv.Atoi(fmt.Sprint(slot))
			return i, v
		}
	}
	t.Fatalf("no node holds a key of %s", id)
	return 0, 0
}

func nodeID(t *testing.T, n *redistest.Server) string {
	t.Helper()
	id, err := redistest.Do(n.Addr, "CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(id)
}

func mustDo(t *testing.T, addr string, args ...string) {
	t.Helper()
	if _, err := redistest.Do(addr, args...); err != nil {
		t.Fatalf("%s %v: %v", addr, args, err)
	}
}

// A hung cluster master (frozen: it keeps its connections and answers
// nothing) holds its own callers' checks until the Redis timeout once;
// then its breaker in the limiter answers them at once, by the failure
// mode; callers on the other masters go on being counted, at their pace,
// and are never answered degraded. With one pipeline for all nodes every
// check waited for the hung one (attack 48: 24 checks answered in 4 s
// where 1,500 were asked), and the service's breaker then answered
// everyone degraded.
func TestClusterHungMasterHoldsOnlyItsCallers(t *testing.T) {
	nodes, hung, healthy, check := oneMasterAndTheOthers(t)
	for _, id := range append(hung, healthy...) {
		if r, err := check(id); err != nil || r.status != 200 {
			t.Fatalf("%s before: %v %v", id, r, err)
		}
	}
	nodes[0].Freeze()
	defer nodes[0].Thaw()
	var answered, degraded, hungDegraded atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, id := range append(hung, healthy...) {
		untilStopped(stop, &wg, func() bool {
			r, err := check(id)
			if err != nil || r.status != 200 {
				t.Errorf("%s: %v %v", id, r, err)
				return false
			}
			isDegraded := strings.Contains(string(r.body), `"degraded"`)
			switch {
			case i < len(hung):
				if isDegraded {
					hungDegraded.Add(1)
				}
			case isDegraded:
				degraded.Add(1)
			default:
				answered.Add(1)
			}
			return true
		})
	}
	// Bounded waits: the hung master's callers must take the failure mode,
	// at once once the node's breaker opened (each waiting out the Redis
	// timeout, and the client's redials, they made a few checks a second),
	// and the others go on meanwhile.
	for deadline := time.Now().Add(20 * time.Second); hungDegraded.Load() < 500 || answered.Load() < 300; {
		if time.Now().After(deadline) {
			t.Errorf("after 20 s with a master hung: %d checks of the other masters' callers answered, %d of the hung one's degraded", answered.Load(), hungDegraded.Load())
			break
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("with a master hung: %d checks of the other masters' callers answered, %d of the hung one's degraded", answered.Load(), hungDegraded.Load())
	close(stop)
	wg.Wait()
	if n := degraded.Load(); n > 0 {
		t.Errorf("%d checks of callers on healthy masters answered degraded while one master hung", n)
	}
}

// oneMasterAndTheOthers starts a service on a three-master cluster and
// finds eight callers whose counters live on the first master and two on
// each of the others; check asks for one caller (a fixed window of a
// million an hour: never refused in a test).
func oneMasterAndTheOthers(t *testing.T) (nodes []*redistest.Server, first, others []string, check func(id string) (*response, error)) {
	t.Helper()
	nodes = redistest.StartCluster(t, 3)
	s := startServiceOn(t, nil, "redis-cluster://"+nodes[0].Addr+","+nodes[1].Addr, "", nil)
	first = callersOn(t, nodes[0], 8)
	others = append(callersOn(t, nodes[1], 2), callersOn(t, nodes[2], 2)...)
	check = func(id string) (*response, error) {
		return s.tryDo("POST", "/v1/rate-limit/check", map[string]any{"user_id": id, "endpoint": "/h", "limit": 1_000_000, "window_seconds": 3600, "strategy": "fixed_window"})
	}
	return nodes, first, others, check
}

// One master answering with an error of its own (a full shard's OOM,
// NOREPLICAS with a replica gone) puts its own callers in the failure mode
// and nobody else: counted by the service-wide breaker, five such replies
// in a row sent every caller of every master to the failure mode for as
// long as the fault lasted (attack 52 F1). The other masters' callers ask
// at a steady pace, so that a consecutive-failures breaker sees the
// failing master's streak (a busy healthy caller's successes between its
// failures would keep it closed whatever it counts).
func TestClusterOneMastersErrorsHoldOnlyItsCallers(t *testing.T) {
	nodes, failing, healthy, check := oneMasterAndTheOthers(t)
	for _, tc := range []struct {
		name         string
		fault, clear [][]string
	}{
		{"OOM", [][]string{{"CONFIG", "SET", "maxmemory-policy", "noeviction"}, {"CONFIG", "SET", "maxmemory", "1"}}, [][]string{{"CONFIG", "SET", "maxmemory", "0"}}},
		{"NOREPLICAS", [][]string{{"CONFIG", "SET", "min-replicas-to-write", "2"}}, [][]string{{"CONFIG", "SET", "min-replicas-to-write", "0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, id := range append(failing, healthy...) {
				if r, err := check(id); err != nil || r.status != 200 || strings.Contains(string(r.body), `"degraded"`) {
					t.Fatalf("%s before: %v %v", id, r, err)
				}
			}
			redis := func(cmds [][]string) {
				for _, c := range cmds {
					if _, err := redistest.Do(nodes[0].Addr, c...); err != nil {
						t.Fatalf("%v: %v", c, err)
					}
				}
			}
			redis(tc.fault)
			defer redis(tc.clear)
			var answered, degraded, failingDegraded atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for _, id := range failing {
				untilStopped(stop, &wg, func() bool {
					r, err := check(id)
					if err != nil || r.status != 200 {
						t.Errorf("%s: %v %v", id, r, err)
						return false
					}
					if strings.Contains(string(r.body), `"degraded"`) {
						failingDegraded.Add(1)
					}
					return true
				})
			}
			for _, id := range healthy {
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				untilStopped(stop, &wg, func() bool {
					select {
					case <-tick.C:
					case <-stop:
						return false
					}
					r, err := check(id)
					if err != nil || r.status != 200 {
						t.Errorf("%s: %v %v", id, r, err)
						return false
					}
					if strings.Contains(string(r.body), `"degraded"`) {
						degraded.Add(1)
					} else {
						answered.Add(1)
					}
					return true
				})
			}
			for deadline := time.Now().Add(20 * time.Second); failingDegraded.Load() < 300 || answered.Load()+degraded.Load() < 100; {
				if time.Now().After(deadline) {
					t.Errorf("after 20 s: %d checks of the failing master's callers degraded, %d of the others' answered", failingDegraded.Load(), answered.Load()+degraded.Load())
					break
				}
				time.Sleep(time.Millisecond)
			}
			close(stop)
			wg.Wait()
			t.Logf("%s on one master: %d of its callers' checks degraded; the others' %d answered, %d degraded", tc.name, failingDegraded.Load(), answered.Load(), degraded.Load())
			if n := degraded.Load(); n > 0 {
				t.Errorf("%d checks of callers on healthy masters answered degraded while one master answered %s", n, tc.name)
			}
		})
	}
}
