package trust

import (
	"errors"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// keys is a set over a real store in a temporary directory, with this
// host's key id self.
func keys(t *testing.T) Keys {
	t.Helper()
	h := testhost.New(t, "")
	return Keys{Store: h.Store, Self: record.Sum([]byte("this host")), Log: testhost.Log(t)}
}

// A key added is trusted and listed after this host's, in key id order,
// whichever form of its id was given.
func TestAddListsAfterThisHost(t *testing.T) {
	k := keys(t)
	a, b := record.Sum([]byte("a")), record.Sum([]byte("b"))
	if b.String() < a.String() {
		a, b = b, a
	}
	if k.Trusted(a) || k.Trusted(b) {
		t.Fatal("a key trusted before it was added")
	}
	got, err := k.Add(b.String(), "second")
	if err != nil || got != (Key{Key: b, Name: "second"}) {
		t.Fatalf("Add(%s) = %+v, %v", b, got, err)
	}
	// Without its b3: prefix, as a user may paste it.
	if _, err := k.Add(strings.TrimPrefix(a.String(), record.AddressPrefix), "first"); err != nil {
		t.Fatal(err)
	}
	list, err := k.List()
	if err != nil {
		t.Fatal(err)
	}
	want := []Key{{Key: k.Self, Name: SelfName, Self: true}, {Key: a, Name: "first"}, {Key: b, Name: "second"}}
	if len(list) != len(want) {
		t.Fatalf("List = %+v, want %+v", list, want)
	}
	for i := range want {
		if list[i] != want[i] {
			t.Fatalf("List[%d] = %+v, want %+v", i, list[i], want[i])
		}
	}
	if !k.Trusted(a) || !k.Trusted(b) || !k.Trusted(k.Self) {
		t.Fatal("a listed key is not trusted")
	}
}

// This host's own key is always trusted: adding it answers Self and
// stores nothing; removing it is refused with ErrKey, and it stays.
func TestThisHostsKey(t *testing.T) {
	k := keys(t)
	got, err := k.Add(k.Self.String(), "another name")
	if err != nil || got != (Key{Key: k.Self, Name: SelfName, Self: true}) {
		t.Fatalf("Add(self) = %+v, %v", got, err)
	}
	if stored, err := k.Store.TrustedKeys(); err != nil || len(stored) != 0 {
		t.Fatalf("adding this host's key stored %+v, %v", stored, err)
	}
	err = k.Remove(k.Self.String())
	if !errors.Is(err, ErrKey) || err.Error() != "invalid request: this host's own key is always trusted" {
		t.Fatalf("Remove(self) = %v, want ErrKey", err)
	}
	if !k.Trusted(k.Self) {
		t.Fatal("this host's key is no longer trusted")
	}
}

// A removed key is no longer trusted nor listed; removing a key not in the
// set is the store's ErrNotTrusted.
func TestRemove(t *testing.T) {
	k := keys(t)
	a := record.Sum([]byte("a"))
	if _, err := k.Add(a.String(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := k.Remove(a.String()); err != nil {
		t.Fatal(err)
	}
	if k.Trusted(a) {
		t.Fatal("a removed key is trusted")
	}
	if list, err := k.List(); err != nil || len(list) != 1 || !list[0].Self {
		t.Fatalf("List after the removal = %+v, %v", list, err)
	}
	if err := k.Remove(a.String()); !errors.Is(err, store.ErrNotTrusted) {
		t.Fatalf("Remove of a key not trusted = %v, want store.ErrNotTrusted", err)
	}
}

// A key id that does not parse is refused with ErrKey (and pkg/record's
// ErrAddress), by Add and Remove alike, and changes nothing; a name the
// store refuses is the store's ErrKeyName.
func TestMalformedKey(t *testing.T) {
	k := keys(t)
	for _, bad := range []string{"", "b3:", "b3:not-an-address", "zz", strings.Repeat("A", 44)} {
		_, err := k.Add(bad, "x")
		if !errors.Is(err, ErrKey) || !errors.Is(err, record.ErrAddress) || !strings.HasPrefix(err.Error(), "invalid request: host key ") {
			t.Errorf("Add(%q) = %v, want ErrKey", bad, err)
		}
		if err := k.Remove(bad); !errors.Is(err, ErrKey) {
			t.Errorf("Remove(%q) = %v, want ErrKey", bad, err)
		}
	}
	if _, err := k.Add(record.Sum([]byte("a")).String(), string([]byte{0xff})); !errors.Is(err, store.ErrKeyName) {
		t.Errorf("a name that is not UTF-8: %v, want store.ErrKeyName", err)
	}
	if stored, err := k.Store.TrustedKeys(); err != nil || len(stored) != 0 {
		t.Fatalf("refused keys stored %+v, %v", stored, err)
	}
}

// Names gives each signer the name its key is trusted under (this host's
// for its own, none for a key not in the set), in the signers' order, and
// keeps the rest of each signer as it was.
func TestNames(t *testing.T) {
	k := keys(t)
	a, stranger := record.Sum([]byte("a")), record.Sum([]byte("stranger"))
	if _, err := k.Add(a.String(), "build farm"); err != nil {
		t.Fatal(err)
	}
	in := []attest.Signer{
		{Index: 1, Interval: 1, Key: k.Self, Trusted: true},
		{Index: 3, Interval: 2, Key: stranger},
		{Index: 5, Interval: 3, Key: a, Trusted: true},
	}
	got := k.Names(in)
	want := []string{SelfName, "", "build farm"}
	if len(got) != len(in) {
		t.Fatalf("Names = %+v", got)
	}
	for i := range in {
		if got[i].Signer != in[i] || got[i].Name != want[i] {
			t.Errorf("Names[%d] = %+v, want %+v named %q", i, got[i], in[i], want[i])
		}
	}
	if got := k.Names(nil); got == nil || len(got) != 0 {
		t.Errorf("Names(nil) = %#v, want empty and not nil", got)
	}
}

// A key admitted to the fleet as a host is trusted, though not listed;
// one the fleet does not admit is not.
func TestAdmittedTrusted(t *testing.T) {
	k := keys(t)
	fleetHost, stranger := record.Sum([]byte("fleet host")), record.Sum([]byte("stranger"))
	k.Admitted = func(key record.Address) bool { return key == fleetHost }
	if !k.Trusted(fleetHost) || k.Trusted(stranger) {
		t.Fatalf("Trusted(admitted) = %v, Trusted(stranger) = %v; want true, false", k.Trusted(fleetHost), k.Trusted(stranger))
	}
	if list, err := k.List(); err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v; want this host only", list, err)
	}
}
