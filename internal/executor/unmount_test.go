package executor

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

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

// removeTree detaches what is mounted below a directory before removing
// it, and removes nothing while a mount it cannot detach is left.
func TestRemoveTreeDetachesMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := t.TempDir()
	sub := filepath.Join(dir, "yard", "cpu")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	keep := filepath.Join(sub, "keep")
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := removeTree(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s is still there: %v", dir, err)
	}
	if left, _ := mountsBelow(dir); len(left) != 0 {
		t.Fatalf("mounts left below %s: %v", dir, left)
	}
}
