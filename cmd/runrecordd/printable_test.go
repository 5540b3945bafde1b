package main

import "testing"

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"call-1":                    "call-1",
		"héllo wörld":               "héllo wörld",
		"\x1b]0;owned\x07":          `\u001b]0;owned\u0007`,
		"a\tb\nc":                   `a\u0009b\u000ac`,
		"csi\u009b2J":               `csi\u009b2J`,
		"bad\xffutf8":               `bad\xffutf8`,
		`back\slash` + "\x1b":       `back\\slash\u001b`,
		"zero\u200bwidth-is-format": `zero\u200bwidth-is-format`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := printableText("line 1\n\tline 2\x1b[2J\r"), "line 1\n\tline 2\\u001b[2J\\u000d"; got != want {
		t.Errorf("printableText = %q, want %q", got, want)
	}
}
