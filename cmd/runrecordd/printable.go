package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s safe to write to an operator's terminal: every rune
// that is not a graphic character or a plain space (control characters,
// C1 controls such as CSI, tabs that would break a table's columns) and
// every byte that is not UTF-8 is written as an escape. Call ids, call
// kinds, payloads and close reasons come from units and bundles, and an
// escape sequence in one must not reach the terminal as one.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || r != ' ' && !unicode.IsGraphic(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == ' ' || unicode.IsGraphic(r):
			b.WriteRune(r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}
