package redisconn

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-rl/tollgate/testkit/redistest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		url      string
		topology Topology
		addrs    string
		db       int
		master   string
	}{
		{"redis://127.0.0.1:6379/0", Single, "127.0.0.1:6379", 0, ""},
		{"redis://:pw@127.0.0.1:6379/3", Single, "127.0.0.1:6379", 3, ""},
		{"rediss://[::1]:6380", Single, "[::1]:6380", 0, ""},
		{"redis-sentinel://127.0.0.1:26379,127.0.0.1:26380/1?master=mymaster", Sentinel, "127.0.0.1:26379,127.0.0.1:26380", 1, "mymaster"},
		{"redis-cluster://127.0.0.1:7000,127.0.0.1:7001", Cluster, "127.0.0.1:7000,127.0.0.1:7001", 0, ""},
		{"redis-cluster://127.0.0.1:7000", Cluster, "127.0.0.1:7000", 0, ""},
	}
	for _, tt := range tests {
		o, err := Parse(tt.url)
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		if o.Topology != tt.topology || strings.Join(o.Universal.Addrs, ",") != tt.addrs || o.Universal.DB != tt.db || o.Universal.MasterName != tt.master {
			t.Errorf("%s: %+v", tt.url, o)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for url, want := range map[string]string{
		"http://127.0.0.1:6379":                 "unknown scheme",
		"redis://":                              "no host",
		"redis://127.0.0.1":                     "host:port",
		"redis://a:1,b:2":                       "single server takes one host",
		"redis://127.0.0.1:6379/x":              "database",
		"redis-sentinel://127.0.0.1:26379":      "master",
		"redis-cluster://127.0.0.1:7000/2":      "database 0",
		"redis://127.0.0.1:6379?timeout=1":      "unknown parameter",
		"redis://127.0.0.1:99999":               "bad port",
		"redis://user:hunter2@127.0.0.1:x%zz/0": "",
	} {
		_, err := Parse(url)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v; want an error containing %q", url, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("Parse(%q) error leaks the password: %v", url, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("redis://127.0.0.1:6379/0")
	f.Add("redis-sentinel://a:1,b:2/0?master=m")
	f.Add("redis-cluster://a:1")
	f.Fuzz(func(t *testing.T, s string) {
		o, err := Parse(s)
		if err != nil {
			return
		}
		if len(o.Universal.Addrs) == 0 {
			t.Fatalf("Parse(%q) accepted a URL with no address", s)
		}
	})
}

// The three topologies, each against real processes: the client must reach
// the data through whatever is behind the URL.
func TestTopologies(t *testing.T) {
	single := redistest.Start(t)
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "tollgate")
	nodes := redistest.StartCluster(t, 3)
	for _, tt := range []struct {
		url  string
		want Topology
	}{
		{"redis://" + single.Addr + "/0", Single},
		{"redis-sentinel://" + sentinel.Addr + "/0?master=tollgate", Sentinel},
		{"redis-cluster://" + nodes[0].Addr, Cluster},
	} {
		t.Run(string(tt.want), func(t *testing.T) {
			rdb, topo, err := New(tt.url, time.Second, 4)
			if err != nil || topo != tt.want {
				t.Fatalf("New: %v, %v", topo, err)
			}
			defer rdb.Close()
			ctx := context.Background()
			// Keys in many slots: a cluster client must route each.
			for _, k := range []string{"a", "b", "c", "{user:x}:1", "{user:y}:1"} {
				if err := rdb.Set(ctx, k, k, time.Minute).Err(); err != nil {
					t.Fatalf("SET %s: %v", k, err)
				}
				if v := rdb.Get(ctx, k).Val(); v != k {
					t.Fatalf("GET %s = %q", k, v)
				}
			}
		})
	}
}

// A cluster client reloads its slot map every second: a dead master
// answers no MOVED, and go-redis's own interval (60 s) kept its slots on it
// that long after its replica was promoted (make reliability's Cluster row).
func TestClusterReloadsSlotMap(t *testing.T) {
	c, topo, err := New("redis-cluster://127.0.0.1:7000,127.0.0.1:7001", 200*time.Millisecond, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, ok := c.(*redis.ClusterClient)
	if topo != Cluster || !ok {
		t.Fatalf("topology %s, client %T", topo, c)
	}
	if got := cc.Options().ClusterStateReloadInterval; got != time.Second {
		t.Fatalf("slot map reloaded every %v", got)
	}
}
