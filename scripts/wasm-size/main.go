// Command wasm-size tells what a Wasm module's size is made of: the bytes of
// each section, and the code bytes of its functions summed by Go package
// (from the module's name section). `go tool nm` does not read Wasm.
//
//	go run ./scripts/wasm-size [-top 25] [-funcs 0] build/tollgate.wasm
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

func main() {
	top := flag.Int("top", 25, "packages to list")
	funcs := flag.Int("funcs", 0, "largest functions to list")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: wasm-size [-top N] [-funcs N] MODULE.wasm")
		os.Exit(2)
	}
	b, err := os.ReadFile(flag.Arg(0))
	if err == nil {
		err = report(b, *top, *funcs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wasm-size:", err)
		os.Exit(1)
	}
}

// reader reads the LEB128 and vector encodings of the Wasm binary format.
type reader struct {
	b   []byte
	pos int
}

func (r *reader) u32() (uint32, error) {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		if r.pos >= len(r.b) {
			return 0, errors.New("truncated LEB128")
		}
		c := r.b[r.pos]
		r.pos++
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, errors.New("LEB128 too long")
}

func (r *reader) bytes(n uint32) ([]byte, error) {
	if r.pos+int(n) > len(r.b) {
		return nil, errors.New("truncated")
	}
	out := r.b[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return out, nil
}

func (r *reader) name() (string, error) {
	n, err := r.u32()
	if err != nil {
		return "", err
	}
	b, err := r.bytes(n)
	return string(b), err
}

var sectionNames = map[byte]string{0: "custom", 1: "type", 2: "import", 3: "function", 5: "memory", 6: "global", 7: "export", 10: "code", 11: "data"}

func report(b []byte, top, funcs int) error {
	if !bytes.HasPrefix(b, []byte("\x00asm\x01\x00\x00\x00")) {
		return errors.New("not a Wasm module")
	}
	r := &reader{b: b, pos: 8}
	var imported uint32
	var bodies []int
	names := map[uint32]string{}
	sections := map[string]int{}
	for r.pos < len(b) {
		id := b[r.pos]
		r.pos++
		size, err := r.u32()
		if err != nil {
			return err
		}
		body, err := r.bytes(size)
		if err != nil {
			return err
		}
		sr := &reader{b: body}
		label := sectionNames[id]
		switch id {
		case 0:
			n, err := sr.name()
			if err != nil {
				return err
			}
			label = "custom " + n
			if n == "name" {
				if err := readNames(sr, names); err != nil {
					return fmt.Errorf("name section: %w", err)
				}
			}
		case 2:
			if imported, err = countFuncImports(sr); err != nil {
				return fmt.Errorf("import section: %w", err)
			}
		case 10:
			n, err := sr.u32()
			if err != nil {
				return err
			}
			for i := uint32(0); i < n; i++ {
				sz, err := sr.u32()
				if err != nil {
					return err
				}
				if _, err := sr.bytes(sz); err != nil {
					return err
				}
				bodies = append(bodies, int(sz))
			}
		}
		if label == "" {
			label = fmt.Sprintf("section %d", id)
		}
		sections[label] += int(size)
	}
	fmt.Printf("module: %d bytes\n", len(b))
	printSorted(sections, 0, "section")
	byPkg := map[string]int{}
	for i, sz := range bodies {
		byPkg[pkgOf(names[imported+uint32(i)])] += sz
	}
	fmt.Println()
	printSorted(byPkg, top, "code by package")
	if funcs > 0 {
		byFunc := map[string]int{}
		for i, sz := range bodies {
			byFunc[names[imported+uint32(i)]] += sz
		}
		fmt.Println()
		printSorted(byFunc, funcs, "largest functions")
	}
	return nil
}

// readNames reads the function-names subsection (id 1) of a name section.
func readNames(r *reader, names map[uint32]string) error {
	for r.pos < len(r.b) {
		id := r.b[r.pos]
		r.pos++
		size, err := r.u32()
		if err != nil {
			return err
		}
		sub, err := r.bytes(size)
		if err != nil {
			return err
		}
		if id != 1 {
			continue
		}
		sr := &reader{b: sub}
		n, err := sr.u32()
		if err != nil {
			return err
		}
		for i := uint32(0); i < n; i++ {
			idx, err := sr.u32()
			if err != nil {
				return err
			}
			name, err := sr.name()
			if err != nil {
				return err
			}
			names[idx] = name
		}
	}
	return nil
}

// countFuncImports counts the imported functions, which come first in the
// function index space.
func countFuncImports(r *reader) (uint32, error) {
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	var funcs uint32
	for i := uint32(0); i < n; i++ {
		if _, err := r.name(); err != nil {
			return 0, err
		}
		if _, err := r.name(); err != nil {
			return 0, err
		}
		if r.pos >= len(r.b) {
			return 0, errors.New("truncated import")
		}
		kind := r.b[r.pos]
		r.pos++
		switch kind {
		case 0: // function: type index
			funcs++
			_, err = r.u32()
		case 1: // table: reftype, limits
			r.pos++
			err = skipLimits(r)
		case 2: // memory: limits
			err = skipLimits(r)
		case 3: // global: valtype, mutability
			r.pos += 2
		default:
			return 0, fmt.Errorf("import kind %d", kind)
		}
		if err != nil {
			return 0, err
		}
	}
	return funcs, nil
}

func skipLimits(r *reader) error {
	if r.pos >= len(r.b) {
		return errors.New("truncated limits")
	}
	flag := r.b[r.pos]
	r.pos++
	if _, err := r.u32(); err != nil {
		return err
	}
	if flag&1 != 0 {
		_, err := r.u32()
		return err
	}
	return nil
}

// pkgOf is the Go package of a function name. Go writes Wasm names with "/"
// as "_" ("crypto_internal_fips140_rsa.VerifyPKCS1v15"), so the package ends
// at the first dot, past a module's domain ("github.com_...").
func pkgOf(fn string) string {
	if fn == "" {
		return "(unnamed)"
	}
	start := 0
	for _, domain := range []string{"github.com_", "golang.org_", "vendor_golang.org_"} {
		if strings.HasPrefix(fn, domain) {
			start = len(domain)
		}
	}
	if dot := strings.IndexByte(fn[start:], '.'); dot >= 0 {
		return fn[:start+dot]
	}
	return fn
}

func printSorted(m map[string]int, top int, title string) {
	type kv struct {
		k string
		v int
	}
	var list []kv
	total := 0
	for k, v := range m {
		list = append(list, kv{k, v})
		total += v
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v || list[i].v == list[j].v && list[i].k < list[j].k })
	if top > 0 && len(list) > top {
		list = list[:top]
	}
	fmt.Printf("%-48s %10s\n", title, "bytes")
	for _, e := range list {
		fmt.Printf("%-48s %10d  %4.1f%%\n", e.k, e.v, 100*float64(e.v)/float64(total))
	}
}
