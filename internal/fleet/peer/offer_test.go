package peer

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Another host's egress ceiling is taken as IPv4 prefixes, at most
// maxOfferEgress of them: anything else refuses its whole offer
// (bundle.ErrLimit), the bad value quoted cut short.
func TestOfferCeiling(t *testing.T) {
	host := record.Sum([]byte("host"))
	got, err := ceilingOf(host, []string{"203.0.113.0/24", "10.0.0.1/32"})
	want := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("10.0.0.1/32")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"2001:db8::/32", "203.0.113.0", "not a prefix", "203.0.113.0/33", string(make([]byte, 1<<20))} {
		if _, err := ceilingOf(host, []string{"203.0.113.0/24", bad}); !errors.Is(err, bundle.ErrLimit) || len(err.Error()) > 512 {
			t.Errorf("%.20q: %.200v, want ErrLimit, cut short", bad, err)
		}
	}
	many := make([]string, maxOfferEgress+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.%d.0/24", i>>8, i&0xff)
	}
	if err := checkOffer(host, OfferAnswer{EgressAllow: many}); !errors.Is(err, bundle.ErrLimit) {
		t.Fatalf("%d prefixes: %v", len(many), err)
	}
	if err := checkOffer(host, OfferAnswer{EgressAllow: many[:maxOfferEgress]}); err != nil {
		t.Fatalf("%d prefixes: %v", maxOfferEgress, err)
	}
}
