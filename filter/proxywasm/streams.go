package proxywasm

// streamTable holds the live streams by context id: an open-addressed
// table of linear probing, sized a power of two. A stream costs a Go map
// an insert, three or four lookups and a delete, about 250 ns under wazero
// (the map hashes with the generic fallback: Wasm has no AES); the table
// does the same in about 25.
//
// Context id 0 is never a stream's (proxy-wasm numbers contexts from 1):
// it marks a free slot, and put refuses it.
type streamTable struct {
	ids  []uint32
	vals []httpState
	n    int
}

func newStreamTable() streamTable {
	return streamTable{ids: make([]uint32, 64), vals: make([]httpState, 64)}
}

// home is where id's probe starts: Fibonacci hashing spreads the
// consecutive ids a host hands out, and the mask keeps it in the table.
func (t *streamTable) home(id uint32) int {
	return int((id * 0x9E3779B1) & uint32(len(t.ids)-1))
}

// slot is id's slot, or the free slot that ends its probe.
func (t *streamTable) slot(id uint32) int {
	mask := len(t.ids) - 1
	i := t.home(id)
	for t.ids[i] != id && t.ids[i] != 0 {
		i = (i + 1) & mask
	}
	return i
}

func (t *streamTable) get(id uint32) (httpState, bool) {
	if id == 0 {
		return httpState{}, false
	}
	i := t.slot(id)
	return t.vals[i], t.ids[i] == id
}

func (t *streamTable) put(id uint32, s httpState) {
	if id == 0 {
		return
	}
	if (t.n+1)*4 > len(t.ids)*3 { // at most three quarters full
		t.grow()
	}
	i := t.slot(id)
	if t.ids[i] == 0 {
		t.n++
	}
	t.ids[i], t.vals[i] = id, s
}

// remove deletes id, moving back each later entry of the run whose probe
// would otherwise pass the hole (no tombstones: lookups stay short however
// many streams came and went).
func (t *streamTable) remove(id uint32) {
	if id == 0 {
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
	t.ids[i], t.vals[i] = 0, httpState{}
}

func (t *streamTable) grow() {
	old, vals := t.ids, t.vals
	t.ids, t.vals, t.n = make([]uint32, 2*len(old)), make([]httpState, 2*len(old)), 0
	for i, id := range old {
		if id != 0 {
			t.put(id, vals[i])
		}
	}
}
