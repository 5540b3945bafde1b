package failpoint

import "testing"

// Every step is named once, and reaching a step that is not armed goes on.
func TestSteps(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range append(append(append([]string(nil), Steps...), MigrationSteps...), LazySteps...) {
		if s == "" || seen[s] {
			t.Fatalf("step %q named twice or empty", s)
		}
		seen[s] = true
		if s != armed {
			Fire(s)
		}
	}
}
