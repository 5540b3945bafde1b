package executor

import "testing"

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:           "/a/b",
		`/a\040b`:        "/a b",
		`/tab\011x\134y`: "/tab\tx\\y",
		`/short\04`:      `/short\04`,
		`/not\999octal`:  `/not\999octal`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}
