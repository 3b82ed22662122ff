// Package rls serves Envoy's rate limit service protocol
// (envoy.service.ratelimit.v3.RateLimitService) from envoyproxy/ratelimit's
// configuration format, counted in Tollgate's Redis by Tollgate's scripts,
// and Tollgate's own rules, tiers and API keys through the "tollgate"
// domain.
package rls

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Bounds on a configuration (a file an operator writes, but a directory can
// hold many): a descriptor tree deeper than a request may be long is dead
// weight, and one file is read whole.
const (
	maxConfigBytes = 4 << 20
	maxFiles       = 1000
	maxDepth       = MaxEntries
)

// Unit is a limit's unit, as the protocol names it.
type Unit = rlspb.RateLimitResponse_RateLimit_Unit

// unitSeconds is each unit's window, as envoyproxy/ratelimit counts them (a
// month is 30 days, a year 365).
var unitSeconds = map[Unit]int64{
	rlspb.RateLimitResponse_RateLimit_SECOND: 1,
	rlspb.RateLimitResponse_RateLimit_MINUTE: 60,
	rlspb.RateLimitResponse_RateLimit_HOUR:   3600,
	rlspb.RateLimitResponse_RateLimit_DAY:    86400,
	rlspb.RateLimitResponse_RateLimit_WEEK:   7 * 86400,
	rlspb.RateLimitResponse_RateLimit_MONTH:  30 * 86400,
	rlspb.RateLimitResponse_RateLimit_YEAR:   365 * 86400,
}

// Limit is one configured rate limit.
type Limit struct {
	// Path names the descriptor in errors and metrics: "domain.key_value.key".
	Path            string
	Name            string
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	Shadow          bool
	Replaces        []string
	DetailedMetric  bool
	// Algorithm and Burst are Tollgate's extension; the default (empty) is
	// envoyproxy/ratelimit's fixed window, where every hit counts.
	Algorithm rules.Algorithm
	Burst     int64
}

// Window is the limit's window in seconds.
func (l *Limit) Window() int64 { return unitSeconds[l.Unit] }

type node struct {
	children  map[string]*node // by "key_value", or "key" for any value
	wildcards []wildcard       // children whose value holds '*', in file order
	limit     *Limit
}

type wildcard struct {
	key   string   // "key_val*ue", the child's name in children
	parts []string // key split at each '*'
}

// Config is a loaded configuration: its domains' descriptor trees.
type Config struct {
	domains map[string]*node
}

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// metricDomain is domain as a metric label: a configured domain, or
// "other" (a caller chooses the domain; labels must stay a bounded set).
func (c *Config) metricDomain(domain string) string {
	if _, ok := c.domains[domain]; ok {
		return domain
	}
	return "other"
}

// Load reads path: one YAML file, or every .yaml and .yml file of a
// directory (not its subdirectories), as envoyproxy/ratelimit's runtime
// directory holds them. Every error names the file, the line and the field.
func Load(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("rls_config: %w", err)
	}
	files := []string{path}
	if st.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("rls_config: %w", err)
		}
		files = files[:0]
		for _, e := range ents {
			ext := filepath.Ext(e.Name())
			if e.Type().IsRegular() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(e.Name(), ".") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) > maxFiles {
			return nil, fmt.Errorf("rls_config: %s holds %d configuration files, more than %d", path, len(files), maxFiles)
		}
	}
	c := &Config{domains: map[string]*node{}}
	seen := map[string]string{} // domain -> file
	for _, f := range files {
		data, err := readBounded(f)
		if err != nil {
			return nil, err
		}
		domain, root, err := parseFile(f, data)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[domain]; dup {
			return nil, fmt.Errorf("%s: domain %q is configured in %s already", f, domain, prev)
		}
		seen[domain] = f
		c.domains[domain] = root
	}
	return c, nil
}

func readBounded(f string) ([]byte, error) {
	st, err := os.Stat(f)
	if err != nil {
		return nil, fmt.Errorf("rls_config: %w", err)
	}
	if st.Size() > maxConfigBytes {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", f, st.Size(), maxConfigBytes)
	}
	data, err := os.ReadFile(f)
	if err != nil {
		return nil, fmt.Errorf("rls_config: %w", err)
	}
	return data, nil
}

// Parse reads one configuration file's text (name is for errors).
func Parse(name string, data []byte) (*Config, error) {
	domain, root, err := parseFile(name, data)
	if err != nil {
		return nil, err
	}
	return &Config{domains: map[string]*node{domain: root}}, nil
}

// fieldError is a configuration error at a node of the file.
func fieldError(file string, n *yaml.Node, field, msg string) error {
	return fmt.Errorf("%s:%d: %s: %s", file, n.Line, field, msg)
}

func parseFile(file string, data []byte) (string, *node, error) {
	if len(data) > maxConfigBytes {
		return "", nil, fmt.Errorf("%s: %d bytes, more than %d", file, len(data), maxConfigBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", nil, fmt.Errorf("%s: not YAML: %w", file, err)
	}
	if len(doc.Content) == 0 {
		return "", nil, fmt.Errorf("%s: empty: a configuration needs a domain", file)
	}
	root := doc.Content[0]
	p := parser{file: file}
	fields, err := p.mapping(root, "", "domain", "descriptors")
	if err != nil {
		return "", nil, err
	}
	domainNode := fields["domain"]
	if domainNode == nil {
		return "", nil, fieldError(file, root, "domain", "missing: every file names its domain")
	}
	domain, err := p.str(domainNode, "domain")
	if err != nil {
		return "", nil, err
	}
	if domain == "" || len(domain) > MaxValueLen {
		return "", nil, fieldError(file, domainNode, "domain", fmt.Sprintf("must be 1 to %d bytes", MaxValueLen))
	}
	if domain == TollgateDomain {
		return "", nil, fieldError(file, domainNode, "domain", "tollgate is reserved: Tollgate's own tiers and rules decide it")
	}
	tree := &node{children: map[string]*node{}}
	if d := fields["descriptors"]; d != nil {
		if err := p.descriptors(tree, d, "descriptors", domain, 1); err != nil {
			return "", nil, err
		}
	}
	return domain, tree, nil
}

type parser struct{ file string }

// mapping checks n is a mapping with only the allowed keys, each once.
func (p *parser) mapping(n *yaml.Node, field string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind != yaml.MappingNode {
		return nil, fieldError(p.file, n, orRoot(field), "must be a mapping")
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := join(field, k.Value)
		if k.Kind != yaml.ScalarNode {
			return nil, fieldError(p.file, k, orRoot(field), "keys must be strings")
		}
		if unsupported[k.Value] != "" {
			return nil, fieldError(p.file, k, name, unsupported[k.Value])
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, fieldError(p.file, k, name, "unknown field (allowed: "+strings.Join(allowed, ", ")+")")
		}
		if _, dup := out[k.Value]; dup {
			return nil, fieldError(p.file, k, name, "given twice")
		}
		out[k.Value] = v
	}
	return out, nil
}

// unsupported are envoyproxy/ratelimit fields whose behaviour Tollgate does
// not reproduce: refused by name rather than ignored, so no configuration
// answers differently from the peer without saying so.
var unsupported = map[string]string{
	"quota_mode":      "quota mode is not supported by Tollgate (use a limit, or Tollgate's rules through the tollgate domain)",
	"share_threshold": "shared wildcard thresholds are not supported by Tollgate",
}

func orRoot(field string) string {
	if field == "" {
		return "(document)"
	}
	return field
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", fieldError(p.file, n, field, "must be a string")
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node, field string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, fieldError(p.file, n, field, "must be true or false")
	}
	return b, nil
}

func (p *parser) uint(n *yaml.Node, field string, max uint64) (uint64, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, fieldError(p.file, n, field, "must be a whole number")
	}
	v, err := strconv.ParseUint(n.Value, 10, 64)
	if err != nil || v > max {
		return 0, fieldError(p.file, n, field, fmt.Sprintf("must be a whole number from 0 to %d", max))
	}
	return v, nil
}

func (p *parser) descriptors(parent *node, list *yaml.Node, field, path string, depth int) error {
	if list.Kind != yaml.SequenceNode {
		return fieldError(p.file, list, field, "must be a list")
	}
	if depth > maxDepth {
		return fieldError(p.file, list, field, fmt.Sprintf("nested deeper than %d levels, more entries than a request may send", maxDepth))
	}
	for i, d := range list.Content {
		f := fmt.Sprintf("%s[%d]", field, i)
		fields, err := p.mapping(d, f, "key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "metadata")
		if err != nil {
			return err
		}
		keyNode := fields["key"]
		if keyNode == nil {
			return fieldError(p.file, d, f+".key", "missing")
		}
		key, err := p.str(keyNode, f+".key")
		if err != nil {
			return err
		}
		if key == "" || len(key) > MaxKeyLen {
			return fieldError(p.file, keyNode, f+".key", fmt.Sprintf("must be 1 to %d bytes", MaxKeyLen))
		}
		name := key
		if v := fields["value"]; v != nil {
			value, err := p.str(v, f+".value")
			if err != nil {
				return err
			}
			if len(value) > MaxValueLen {
				return fieldError(p.file, v, f+".value", fmt.Sprintf("longer than %d bytes", MaxValueLen))
			}
			if value != "" {
				name += "_" + value
			}
		}
		if _, dup := parent.children[name]; dup {
			return fieldError(p.file, keyNode, f, fmt.Sprintf("descriptor %q is configured twice at this level", name))
		}
		child := &node{children: map[string]*node{}}
		childPath := path + "." + name
		shadow := false
		if s := fields["shadow_mode"]; s != nil {
			if shadow, err = p.boolean(s, f+".shadow_mode"); err != nil {
				return err
			}
		}
		detailed := false
		if s := fields["detailed_metric"]; s != nil {
			if detailed, err = p.boolean(s, f+".detailed_metric"); err != nil {
				return err
			}
		}
		if s := fields["value_to_metric"]; s != nil {
			if _, err = p.boolean(s, f+".value_to_metric"); err != nil {
				return err
			}
		}
		if m := fields["metadata"]; m != nil && m.Kind != yaml.MappingNode {
			return fieldError(p.file, m, f+".metadata", "must be a mapping")
		}
		if r := fields["rate_limit"]; r != nil {
			if child.limit, err = p.rateLimit(r, f+".rate_limit", childPath); err != nil {
				return err
			}
			child.limit.Shadow, child.limit.DetailedMetric = shadow, detailed
		}
		if sub := fields["descriptors"]; sub != nil {
			if err := p.descriptors(child, sub, f+".descriptors", childPath, depth+1); err != nil {
				return err
			}
		}
		parent.children[name] = child
		if strings.Contains(name, "*") {
			parent.wildcards = append(parent.wildcards, wildcard{key: name, parts: strings.Split(name, "*")})
		}
	}
	return nil
}

func (p *parser) rateLimit(n *yaml.Node, field, path string) (*Limit, error) {
	fields, err := p.mapping(n, field, "unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst")
	if err != nil {
		return nil, err
	}
	l := &Limit{Path: path}
	if u := fields["unlimited"]; u != nil {
		if l.Unlimited, err = p.boolean(u, field+".unlimited"); err != nil {
			return nil, err
		}
	}
	if u := fields["unit"]; u != nil {
		s, err := p.str(u, field+".unit")
		if err != nil {
			return nil, err
		}
		v, ok := rlspb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(s)]
		if !ok || v == 0 {
			return nil, fieldError(p.file, u, field+".unit", fmt.Sprintf("%q is not a unit (second, minute, hour, day, week, month, year)", s))
		}
		if l.Unlimited {
			return nil, fieldError(p.file, u, field+".unit", "an unlimited limit has no unit")
		}
		l.Unit = Unit(v)
	} else if !l.Unlimited {
		return nil, fieldError(p.file, n, field+".unit", "missing (second, minute, hour, day, week, month, year)")
	}
	if r := fields["requests_per_unit"]; r != nil {
		v, err := p.uint(r, field+".requests_per_unit", 1<<32-1)
		if err != nil {
			return nil, err
		}
		l.RequestsPerUnit = uint32(v)
	}
	if s := fields["name"]; s != nil {
		if l.Name, err = p.str(s, field+".name"); err != nil {
			return nil, err
		}
	}
	if r := fields["replaces"]; r != nil {
		if r.Kind != yaml.SequenceNode {
			return nil, fieldError(p.file, r, field+".replaces", "must be a list of {name: ...}")
		}
		for i, e := range r.Content {
			f := fmt.Sprintf("%s.replaces[%d]", field, i)
			ef, err := p.mapping(e, f, "name")
			if err != nil {
				return nil, err
			}
			nm := ef["name"]
			if nm == nil {
				return nil, fieldError(p.file, e, f+".name", "missing")
			}
			name, err := p.str(nm, f+".name")
			if err != nil {
				return nil, err
			}
			if name == "" {
				return nil, fieldError(p.file, nm, f+".name", "empty")
			}
			if name == l.Name {
				return nil, fieldError(p.file, nm, f+".name", "a limit cannot replace itself")
			}
			l.Replaces = append(l.Replaces, name)
		}
	}
	if a := fields["algorithm"]; a != nil {
		s, err := p.str(a, field+".algorithm")
		if err != nil {
			return nil, err
		}
		l.Algorithm = rules.Algorithm(s)
		if !slices.Contains(rules.Algorithms, l.Algorithm) {
			names := make([]string, len(rules.Algorithms))
			for i, x := range rules.Algorithms {
				names[i] = string(x)
			}
			return nil, fieldError(p.file, a, field+".algorithm", fmt.Sprintf("%q is not an algorithm (%s)", s, strings.Join(names, ", ")))
		}
	}
	if b := fields["burst"]; b != nil {
		v, err := p.uint(b, field+".burst", 1<<40)
		if err != nil {
			return nil, err
		}
		if l.Algorithm != rules.TokenBucket && l.Algorithm != rules.GCRA {
			return nil, fieldError(p.file, b, field+".burst", "only token_bucket and gcra have a burst")
		}
		if v > 0 && v < uint64(l.RequestsPerUnit) {
			return nil, fieldError(p.file, b, field+".burst", "must be at least requests_per_unit")
		}
		l.Burst = int64(v)
	}
	if l.Unlimited && (l.Algorithm != "" || l.Burst != 0) {
		return nil, fieldError(p.file, n, field, "an unlimited limit has no algorithm or burst")
	}
	if l.Algorithm != "" && l.RequestsPerUnit == 0 {
		return nil, fieldError(p.file, n, field+".requests_per_unit", "must be at least 1 with an algorithm")
	}
	return l, nil
}
