package proxywasm

// idTable holds values by a host-given uint32 id (a context id, a callout
// token): an open-addressed table of linear probing, sized a power of two.
// A Go map costs an insert, a few lookups and a delete about 250 ns under
// wazero (it hashes with the generic fallback: Wasm has no AES); the table
// does the same in about 25. Id 0 marks a free slot, so its value, should
// a host hand out 0, is kept beside the slots.
type idTable[V any] struct {
	ids  []uint32
	vals []V
	n    int
	// zero and hasZero hold id 0's value.
	zero    V
	hasZero bool
}

func newIDTable[V any]() idTable[V] {
	return idTable[V]{ids: make([]uint32, 64), vals: make([]V, 64)}
}

// home is where id's probe starts: Fibonacci hashing spreads the
// consecutive ids a host hands out, and the mask keeps it in the table.
func (t *idTable[V]) home(id uint32) int {
	return int((id * 0x9E3779B1) & uint32(len(t.ids)-1))
}

// slot is id's slot, or the free slot that ends its probe.
func (t *idTable[V]) slot(id uint32) int {
	mask := len(t.ids) - 1
	i := t.home(id)
	for t.ids[i] != id && t.ids[i] != 0 {
		i = (i + 1) & mask
	}
	return i
}

func (t *idTable[V]) get(id uint32) (V, bool) {
	if id == 0 {
		return t.zero, t.hasZero
	}
	i := t.slot(id)
	return t.vals[i], t.ids[i] == id
}

func (t *idTable[V]) put(id uint32, v V) {
	if id == 0 {
		t.zero, t.hasZero = v, true
		return
	}
	if (t.n+1)*4 > len(t.ids)*3 { // at most three quarters full
		t.grow()
	}
	i := t.slot(id)
	if t.ids[i] == 0 {
		t.n++
	}
	t.ids[i], t.vals[i] = id, v
}

// remove deletes id, moving back each later entry of the run whose probe
// would otherwise pass the hole (no tombstones: lookups stay short however
// many ids came and went).
func (t *idTable[V]) remove(id uint32) {
	var none V
	if id == 0 {
		t.zero, t.hasZero = none, false
		return
	}
	mask := len(t.ids) - 1
	i := t.slot(id)
	if t.ids[i] == 0 {
		return
	}
	t.n--
	for j := (i + 1) & mask; t.ids[j] != 0; j = (j + 1) & mask {
		// j's entry may fill the hole at i when its home is not in (i, j]
		// on the ring.
		if h := t.home(t.ids[j]); (j-h)&mask >= (j-i)&mask {
			t.ids[i], t.vals[i] = t.ids[j], t.vals[j]
			i = j
		}
	}
	t.ids[i], t.vals[i] = 0, none
}

// len is how many ids the table holds.
func (t *idTable[V]) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

func (t *idTable[V]) grow() {
	old, vals := t.ids, t.vals
	t.ids, t.vals, t.n = make([]uint32, 2*len(old)), make([]V, 2*len(old)), 0
	for i, id := range old {
		if id != 0 {
			t.put(id, vals[i])
		}
	}
}
