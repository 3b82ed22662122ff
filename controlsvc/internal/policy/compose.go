package policy

import (
	"slices"
	"strconv"

	"github.com/tollgate-rl/tollgate/shared/rules"
)

// Skipped is a runtime entry left out of a composed model: it cannot be
// decided with beside the file's entries and the runtime entries before it
// (a rule naming a tier the file no longer has).
type Skipped struct {
	// Entry names it: "rule 12", "tier 3".
	Entry string
	// Index is its place in the runtime tiers or rules given to Compose.
	Index  int
	IsTier bool
	Err    error
}

// Compose lays runtime tiers and rules over a file's model, which must be
// valid on its own: the model a replica decides with. A runtime entry that
// does not fit is left out and reported, so one bad entry never takes every
// other runtime entry down; the result is always valid. A runtime entry's
// errors name its fields as the admin API does.
func Compose(file *Spec, tiers []Tier, rs []rules.Rule) (*Spec, []Skipped) {
	n := names{fileTiers: len(file.Tiers), fileRules: len(file.Rules)}
	all := *file
	all.Tiers = append(slices.Clone(file.Tiers), tiers...)
	all.Rules = append(slices.Clone(file.Rules), rs...)
	if all.validate(n) == nil {
		return &all, nil
	}
	// Something does not fit: add the entries one at a time, tiers first
	// (rules name them), keeping each that leaves the whole valid. Only a
	// broken store pays for this.
	c := *file
	c.Tiers, c.Rules = slices.Clone(file.Tiers), slices.Clone(file.Rules)
	var skips []Skipped
	for i, t := range tiers {
		c.Tiers = append(c.Tiers, t)
		if err := c.validate(n); err != nil {
			c.Tiers = c.Tiers[:len(c.Tiers)-1]
			skips = append(skips, Skipped{Entry: "tier " + strconv.Itoa(t.ID), Index: i, IsTier: true, Err: err})
		}
	}
	for i, r := range rs {
		c.Rules = append(c.Rules, r)
		if err := c.validate(n); err != nil {
			c.Rules = c.Rules[:len(c.Rules)-1]
			skips = append(skips, Skipped{Entry: "rule " + r.ID, Index: i, Err: err})
		}
	}
	return &c, skips
}
