package proxywasm

import (
	"encoding/binary"
	"testing"
)

// checkTable compares the table with a map after every operation: same
// entries, same count, every key found.
func checkTable(t *testing.T, tab *idTable[httpState], want map[uint32]uint32, step int) {
	t.Helper()
	if tab.len() != len(want) {
		t.Fatalf("step %d: %d entries, want %d", step, tab.len(), len(want))
	}
	for id, root := range want {
		s, ok := tab.get(id)
		if !ok || s.rootID != root {
			t.Fatalf("step %d: get(%d) = %v, %v; want root %d", step, id, s.rootID, ok, root)
		}
	}
	held := 0
	if tab.hasZero {
		held++
		if _, ok := want[0]; !ok {
			t.Fatalf("step %d: the table holds 0, which was removed", step)
		}
	}
	for _, id := range tab.ids {
		if id != 0 {
			held++
			if _, ok := want[id]; !ok {
				t.Fatalf("step %d: the table holds %d, which was removed", step, id)
			}
		}
	}
	if held != len(want) {
		t.Fatalf("step %d: %d slots used, want %d", step, held, len(want))
	}
}

// runOps applies ops (4 bytes each: the id's low byte and bits, and what
// to do) to a table and a map side by side. Ids are drawn from a small
// range (0 among them) so that probes collide, wrap around the table's end
// and cross holes left by removals.
func runOps(t *testing.T, ops []byte) {
	tab := newIDTable[httpState]()
	want := map[uint32]uint32{}
	for i := 0; i+4 <= len(ops); i += 4 {
		v := binary.LittleEndian.Uint32(ops[i:])
		id := v >> 8 % 512
		switch v & 3 {
		case 0, 1:
			tab.put(id, httpState{rootID: v})
			want[id] = v
		case 2:
			tab.remove(id)
			delete(want, id)
		case 3:
			_, ok := tab.get(id)
			if _, in := want[id]; ok != in {
				t.Fatalf("step %d: get(%d) found %v, want %v", i/4, id, ok, in)
			}
		}
		checkTable(t, &tab, want, i/4)
	}
}

func TestIDTable(t *testing.T) {
	cases := map[string][]byte{}
	// Consecutive ids, as a host hands them out, opened then closed.
	var seq []byte
	for id := uint32(1); id <= 200; id++ {
		seq = binary.LittleEndian.AppendUint32(seq, id<<8|0)
	}
	for id := uint32(1); id <= 200; id += 3 {
		seq = binary.LittleEndian.AppendUint32(seq, id<<8|2)
	}
	cases["consecutive, then every third removed"] = seq
	// A pseudo-random mix over a range of ids that collide.
	var mix []byte
	x := uint32(1)
	for range 5000 {
		x = x*1664525 + 1013904223
		mix = binary.LittleEndian.AppendUint32(mix, x)
	}
	cases["a mix of 5,000 operations"] = mix
	cases["id 0 kept beside the slots"] = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0), 3), 2)
	for name, ops := range cases {
		t.Run(name, func(t *testing.T) { runOps(t, ops) })
	}
}

func FuzzIDTable(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 2, 1, 0, 0, 0, 2, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) { runOps(t, ops) })
}
