// Package paths turns a request path into the one spelling Tollgate counts.
// The filter and the control service both call Normalize before rules match
// or keys are built, so "/api/v1/items", "/api/v1/%69tems", "/api//v1/items/"
// and "/api/v1/items;a" are one resource and one counter: a client cannot
// get a fresh counter by spelling a path differently.
//
// The rules, in order:
//  1. the query ("?...") and fragment ("#...") are dropped;
//  2. percent-escapes of characters that may stand for themselves in a path
//     (A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , = : @) are decoded; an escaped
//     "/" or "\" (%2F, %5C) and a raw "\" become "/", as many servers read
//     them; every other escape is kept with upper-case hex, and every other
//     raw byte is escaped, so "é" and "%C3%A9" are one path;
//  3. the last segment loses its ";" parameters ("/items;jsessionid=1" is
//     "/items", and "..;" is ".."); a ";" that more path follows, or that
//     opens a segment, is an error (upstreams disagree on what it means);
//  4. empty segments (repeated slashes) and "." segments are dropped, ".."
//     removes the segment before it (never above the root);
//  5. a trailing slash is dropped ("/items/" is "/items"); "/" stays "/".
//
// Case is significant (FoldCase folds it where the upstream does not tell
// cases apart). A path that is not origin-form ("/..."), holds a
// control character (raw or escaped) or a raw space, has a malformed escape,
// or is longer than MaxLen is an error: the caller refuses the request rather
// than guess.
package paths

import (
	"errors"
	"strings"

	"github.com/tollgate-rl/tollgate/shared/fielderr"
)

// MaxLen bounds the path (without its query) that is accepted.
const MaxLen = 8192

// ErrInvalid is wrapped by every error of Normalize.
var ErrInvalid = errors.New("invalid path")

// Normalize returns the canonical form of a request path. A path that is
// already canonical is returned as it is, without allocating.
func Normalize(p string) (string, error) {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	if p == "" || p[0] != '/' {
		return "", invalid("%q does not start with /", clip(p))
	}
	if len(p) > MaxLen {
		return "", invalid("%d bytes, at most %d", len(p), MaxLen)
	}
	if canonical(p) {
		return p, nil
	}
	return rebuild(p)
}

// Canonical returns the path of rawPath (what precedes '?') when it is
// canonical already: then Normalize returns it as it is, and neither
// HasEscapedSlash nor HasDotSegment holds (no '%', '\\', ';' or '#', no
// "." or ".." segment). It is the filter's common case in one pass over
// the path, where the three checks make four (FuzzCanonical holds them to
// it).
func Canonical(rawPath string) (string, bool) {
	p := rawPath
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	if p == "" || p[0] != '/' || len(p) > MaxLen || !canonical(p) {
		return "", false
	}
	return p, true
}

// FoldCase returns the canonical path p (a Normalize result) with its ASCII
// letters in lower case, for upstreams that route paths case-insensitively
// (where "/API/Items" is "/api/items" and must be one counter). The hex
// digits of escapes stay upper-case, as Normalize spells them; letters
// outside ASCII are escapes in a canonical path and are left as they are.
// A path with no upper-case letter is returned without allocating.
func FoldCase(p string) string {
	i := 0
	for ; i < len(p); i++ {
		if c := p[i]; c == '%' {
			i += 2
		} else if 'A' <= c && c <= 'Z' {
			break
		}
	}
	if i >= len(p) {
		return p
	}
	b := []byte(p)
	for ; i < len(b); i++ {
		if c := b[i]; c == '%' {
			i += 2
		} else if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// canonical reports whether p needs no change: only plain characters, no
// empty, "." or ".." segment, no trailing slash. Most real paths are; this
// keeps the filter's hot path free of allocations.
func canonical(p string) bool {
	segStart := 1
	for i := 1; i <= len(p); i++ {
		if i < len(p) {
			if c := p[i]; c != '/' {
				if !plain(c) {
					return false
				}
				continue
			}
		}
		switch p[segStart:i] {
		case "", ".", "..":
			return len(p) == 1 // "/" alone is canonical
		}
		segStart = i + 1
	}
	return true
}

// rebuild decodes, splits and joins p. It runs only on paths that are not
// canonical already.
func rebuild(p string) (string, error) {
	decoded := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%':
			if i+2 >= len(p) || unhex(p[i+1]) < 0 || unhex(p[i+2]) < 0 {
				return "", invalid("malformed escape at byte %d", i)
			}
			v := byte(unhex(p[i+1])<<4 | unhex(p[i+2]))
			if v < ' ' || v == 0x7f {
				// An upstream that decodes "%00" may end the path there
				// (C strings) or strip "%0A": one counter per spelling
				// would let those spellings walk around a rule.
				return "", invalid("escaped control character at byte %d", i)
			}
			i += 2
			switch {
			case v == '/' || v == '\\':
				decoded = append(decoded, '/')
			case plain(v):
				decoded = append(decoded, v)
			default:
				decoded = appendEscape(decoded, v)
			}
		case c == '\\':
			decoded = append(decoded, '/')
		case c <= ' ' || c == 0x7f:
			return "", invalid("control character or space at byte %d", i)
		case c == '/' || c == ';' || plain(c):
			decoded = append(decoded, c)
		default:
			// Outside ASCII, or a character that must be escaped ('"', '<',
			// '{'...): one spelling, the escaped one.
			decoded = appendEscape(decoded, c)
		}
	}

	// Segments as offsets into decoded; ".." pops, "" and "." drop.
	var stackBuf [32][2]int
	segs := stackBuf[:0]
	for start := 1; start <= len(decoded); {
		end := start
		for end < len(decoded) && decoded[end] != '/' {
			end++
		}
		seg := decoded[start:end]
		if i := indexByte(seg, ';'); i >= 0 {
			// Upstreams read a parameter three ways: the path ends at the
			// first ';' (Fastify 4), the parameter belongs to its segment
			// (servlets), or ';' is a plain byte (Express, Django). A ';' in
			// the last segment after some name counts as that segment under
			// every reading; anywhere else one reading runs a handler the
			// count does not name (an outsider's "/api/login;/x" ran
			// Fastify's login route 50 times past its limit of 5).
			switch {
			case end < len(decoded):
				return "", invalid("a ';' parameter before more path (upstreams end the path at ';' or keep it in the segment)")
			case i == 0:
				return "", invalid("a segment that is only a ';' parameter (upstreams read it as an empty segment or as a name)")
			}
			seg = seg[:i]
		}
		switch string(seg) { // no allocation: the compiler compares in place
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, [2]int{start, start + len(seg)})
		}
		start = end + 1
	}
	if len(segs) == 0 {
		return "/", nil
	}
	var b strings.Builder
	b.Grow(len(decoded))
	for _, s := range segs {
		b.WriteByte('/')
		b.Write(decoded[s[0]:s[1]])
	}
	if b.Len() > MaxLen {
		// Escaping grew it past the bound: refuse it as if it came so long.
		return "", invalid("%d bytes once escaped, at most %d", b.Len(), MaxLen)
	}
	return b.String(), nil
}

// plain is a byte that stands for itself in a canonical path: RFC 3986
// pchar without "%" (escapes may need decoding) and without ";" (parameters
// are dropped).
func plain(c byte) bool {
	if unreserved(c) {
		return true
	}
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', '=', ':', '@':
		return true
	}
	return false
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// FormUnescape decodes a query parameter's name or value as a form
// decoder does: %XX escapes, and '+' as a space; an escape that is not one
// is kept as it is (as PHP's urldecode keeps it) rather than refused.
func FormUnescape(s string) string {
	if strings.IndexByte(s, '%') < 0 && strings.IndexByte(s, '+') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && unhex(s[i+1]) >= 0 && unhex(s[i+2]) >= 0:
			b = append(b, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func appendEscape(b []byte, c byte) []byte {
	const hex = "0123456789ABCDEF"
	return append(b, '%', hex[c>>4], hex[c&15])
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// clip shortens a path quoted in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// invalid is a field error of kind ErrInvalid; the caller names the field.
func invalid(format string, args ...any) error {
	e := fielderr.New("", format, args...)
	e.Kind = ErrInvalid
	return e
}

// FoldScript drops from a normalised path every segment naming a PHP
// script ("index.php", any case, and the other extensions scriptName
// knows) that more path follows: behind nginx and
// php-fpm, Apache or PHP's own server, "/index.php/api/login" runs the
// front controller with the path info "/api/login", which Symfony and
// Laravel route as "/api/login" (an outsider's login brute force went 7.7
// times past a login rule that way). A last segment stays: "/report.php"
// may be a script of its own. Always on: elsewhere such a path names no
// resource, and counting it as the route costs nobody anything.
func FoldScript(p string) string {
	if !hasScriptSegment(p) {
		return p
	}
	var b strings.Builder
	for rest := p; rest != ""; {
		seg, next := rest, ""
		if i := strings.IndexByte(rest[1:], '/'); i >= 0 {
			seg, next = rest[:i+1], rest[i+1:]
		}
		if next == "" || !scriptName(seg[1:]) {
			b.WriteString(seg)
		}
		rest = next
	}
	if b.Len() == 0 {
		return "/"
	}
	return b.String()
}

// ScriptPath is the path of the PHP script that a normalised path runs
// with path info, "" when it has none: "/login.php/x" runs "/login.php"
// (the first script segment that more path follows, as PHP's own server
// and nginx's usual fastcgi_split_path_info find it). FoldScript is the
// route a front controller reads from that path info; which of the two a
// server runs is its own configuration, so the service counts both.
func ScriptPath(p string) string {
	if !hasScriptSegment(p) {
		return ""
	}
	for i := 1; i < len(p); {
		j := strings.IndexByte(p[i:], '/')
		if j < 0 {
			break
		}
		if scriptName(p[i : i+j]) {
			return p[:i+j]
		}
		i += j + 1
	}
	return ""
}

// hasScriptSegment reports whether a segment that more path follows names
// a PHP script (scriptName).
func hasScriptSegment(p string) bool {
	for i := 2; i < len(p); i++ {
		if p[i] == '/' && p[i-1] != '/' && scriptName(p[strings.LastIndexByte(p[:i], '/')+1:i]) {
			return true
		}
	}
	return false
}

// scriptName reports whether a segment names a PHP script: a name of at
// least one byte with an extension PHP servers run as scripts, in any
// case: ".php"; ".phtml" and ".phar", which Debian's Apache hands to PHP
// (its php.conf matches ".+\.ph(ar|p|tml)$"), and ".pht", which its
// older releases did (attack 55 F6); ".php3" to ".php8", which
// php-fpm's security.limit_extensions lists as examples and sites still
// map. A rule on "/login.phtml" counts "/login.phtml/x" as it counts
// "/login.php/x".
func scriptName(seg string) bool {
	dot := strings.LastIndexByte(seg, '.')
	if dot < 1 {
		return false
	}
	switch ext := seg[dot+1:]; len(ext) {
	case 3:
		return strings.EqualFold(ext, "php") || strings.EqualFold(ext, "pht")
	case 4:
		return strings.EqualFold(ext[:3], "php") && ext[3] >= '3' && ext[3] <= '8' || strings.EqualFold(ext, "phar")
	case 5:
		return strings.EqualFold(ext, "phtml")
	}
	return false
}

// HasDotSegment reports whether the path part of rawPath (before '?')
// has a "." or ".." segment as sent: escaped ("%2E") or with ';'
// parameters ("..;", which Tomcat reads as ".."), between any separators
// Normalize reads ('/', and '\\', %2F and %5C: an outsider's
// "/files/a%2F..%2F..%2Fx" passed a check that split at '/' only).
// Normalize resolves them; an upstream behind a proxy that does not
// (Envoy without normalize_path) gets them as sent, and a wildcard route
// there serves what the filter counted elsewhere.
func HasDotSegment(rawPath string) bool {
	if i := strings.IndexByte(rawPath, '?'); i >= 0 {
		rawPath = rawPath[:i]
	}
	start := 0
	for i := 0; ; {
		n := separatorLen(rawPath, i)
		if i == len(rawPath) || n > 0 {
			seg := rawPath[start:i]
			if j := strings.IndexByte(seg, ';'); j >= 0 {
				seg = seg[:j]
			}
			if isDotSegment(seg) {
				return true
			}
			if i == len(rawPath) {
				return false
			}
			i += n
			start = i
			continue
		}
		i++
	}
}

// separatorLen is the length of the separator Normalize reads at p[i]
// ('/', '\\', %2F, %5C in either case), 0 when there is none.
func separatorLen(p string, i int) int {
	switch {
	case i >= len(p):
		return 0
	case p[i] == '/' || p[i] == '\\':
		return 1
	case p[i] == '%' && i+2 < len(p) && (p[i+1] == '2' && (p[i+2] == 'f' || p[i+2] == 'F') || p[i+1] == '5' && (p[i+2] == 'c' || p[i+2] == 'C')):
		return 3
	}
	return 0
}

// isDotSegment reports whether seg is "." or "..", each dot sent as it is
// or as "%2E" (either case).
func isDotSegment(seg string) bool {
	dots := 0
	for len(seg) > 0 {
		switch {
		case seg[0] == '.':
			seg = seg[1:]
		case len(seg) >= 3 && seg[:2] == "%2" && (seg[2] == 'e' || seg[2] == 'E'):
			seg = seg[3:]
		default:
			return false
		}
		if dots++; dots > 2 {
			return false
		}
	}
	return dots > 0
}

// HasEscapedSlash reports whether the path part of rawPath (before '?')
// holds an escaped slash or backslash (%2F, %5C, either case) or a
// backslash: Normalize reads each as a separator, which an upstream that
// routes before unescaping (Express, Rails) does not.
func HasEscapedSlash(rawPath string) bool {
	if i := strings.IndexByte(rawPath, '?'); i >= 0 {
		rawPath = rawPath[:i]
	}
	for i := 0; i < len(rawPath); i++ {
		if rawPath[i] != '/' && separatorLen(rawPath, i) > 0 {
			return true
		}
	}
	return false
}

// FoldSuffix folds the aliases an upstream may route to one handler from
// the last segment of a normalised path: trailing dots and spaces (IIS and
// Windows drop them: "/login." and "/login%20" are "/login") and a format
// suffix of one to ten letters or digits (Rails' ".:format", Spring's
// suffix matching: "/login.json" is "/login"). It is opt-in (path_aliases =
// "fold"): elsewhere "/report.csv" and "/report.pdf" may be different
// resources, counted together here. Globs are folded alike, so a rule
// pattern can be checked for its folded spelling.
func FoldSuffix(p string) string {
	start := strings.LastIndexByte(p, '/') + 1
	seg := trimDotsAndSpaces(p[start:])
	// Every suffix goes ("/login.x.json" is "/login"), so folding twice
	// changes nothing: a folded rule pattern matches every alias.
	for dot := strings.LastIndexByte(seg, '.'); dot > 0 && formatSuffix(seg[dot+1:]); dot = strings.LastIndexByte(seg, '.') {
		seg = trimDotsAndSpaces(seg[:dot])
	}
	if len(seg) == len(p)-start {
		return p
	}
	if seg == "" {
		// The whole segment was dots, spaces and suffixes: the path ends at
		// its parent, folded in turn.
		if start <= 1 {
			return "/"
		}
		return FoldSuffix(p[:start-1])
	}
	return p[:start] + seg
}

func trimDotsAndSpaces(s string) string {
	for {
		switch {
		case strings.HasSuffix(s, "."):
			s = s[:len(s)-1]
		case strings.HasSuffix(s, "%20"):
			s = s[:len(s)-3]
		default:
			return s
		}
	}
}

// formatSuffix reports whether s is a format extension: 1 to 10 ASCII
// letters or digits.
func formatSuffix(s string) bool {
	if len(s) == 0 || len(s) > 10 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
