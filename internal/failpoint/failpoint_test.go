package failpoint

import "testing"

// Every step is named once, and reaching a step that is not armed goes on.
func TestSteps(t *testing.T) {
	seen := map[string]bool{}
	var all []string
	for _, l := range [][]string{Steps, MigrationSteps, LazySteps, PostCopySteps, LostSteps, SettledSteps, Faults} {
		all = append(all, l...)
	}
	for _, s := range all {
		if s == "" || seen[s] {
			t.Fatalf("step %q named twice or empty", s)
		}
		seen[s] = true
		if !armed[s] {
			Fire(s)
		}
	}
}

// Env arms each of its comma-separated names, and nothing else.
func TestParse(t *testing.T) {
	m := parse("lazy.freeze,lazy.lost,")
	if len(m) != 2 || !m["lazy.freeze"] || !m["lazy.lost"] {
		t.Fatalf("parse: %v", m)
	}
	if len(parse("")) != 0 {
		t.Fatal("an empty Env arms something")
	}
}
