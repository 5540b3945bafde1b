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
func printable(s string) string { return escape(s, false) }

// printableText is printable for a message of several lines (an error with
// a log's tail): newlines and tabs are kept, every other control escaped.
func printableText(s string) string { return escape(s, true) }

func escape(s string, lines bool) string {
	plain := func(r rune) bool {
		return r == ' ' || unicode.IsGraphic(r) || lines && (r == '\n' || r == '\t')
	}
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !plain(r) {
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
		case plain(r):
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
