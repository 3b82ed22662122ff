package redistest

import (
	"strings"
	"testing"
)

func TestStartAndRestart(t *testing.T) {
	s := Start(t)
	if got, err := Do(s.Addr, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING = %v, %v", got, err)
	}
	if got, _ := Do(s.Addr, "CONFIG", "GET", "save"); strings.Join(toStrings(got), "=") != "save=" {
		t.Fatalf("persistence is on: CONFIG GET save = %v", got)
	}
	s.Stop()
	if _, err := Do(s.Addr, "PING"); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	s.Restart()
	if got, err := Do(s.Addr, "PING"); err != nil || got != "PONG" {
		t.Fatalf("PING after Restart = %v, %v", got, err)
	}
}

func TestCluster(t *testing.T) {
	nodes := StartCluster(t, 3)
	info, err := Do(nodes[2].Addr, "CLUSTER", "INFO")
	if err != nil || !strings.Contains(info.(string), "cluster_known_nodes:3") {
		t.Fatalf("CLUSTER INFO = %v, %v", info, err)
	}
}

func TestSentinel(t *testing.T) {
	master := Start(t)
	sentinel := StartSentinel(t, master, "mymaster")
	got, err := Do(sentinel.Addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
	if err != nil || strings.Join(toStrings(got), ":") != master.Addr {
		t.Fatalf("master by name = %v, %v; want %s", got, err, master.Addr)
	}
}

func toStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}
