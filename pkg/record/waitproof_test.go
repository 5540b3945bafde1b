package record

import "testing"

func acct(d []string, r []string) *CallAccount { return &CallAccount{Dispatched: d, Resolved: r} }

func TestWaitProof(t *testing.T) {
	ts := TranscriptSnapshot(fill(7))
	park := []Segment{Suspension(ts, fill(8)), Resumption(ts, 1, Estimated)}
	seq := func(parts ...[]Segment) []Segment {
		var out []Segment
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	ex := func(d, r []string) []Segment { return []Segment{Execution(fill(1), acct(d, r))} }
	for _, c := range []struct {
		name string
		segs []Segment
		want VerdictKind
		seg  int
	}{
		{"empty record", nil, Unproved, -1},
		{"only parks", park, Unproved, -1},
		{"unaccounted interval", []Segment{Execution(fill(1), nil)}, Unproved, 0},
		{"accounted then unaccounted", seq(ex([]string{"a"}, nil), park, []Segment{Execution(fill(1), nil)}), Unproved, 3},
		{"one empty account", ex(nil, nil), NonBlocking, -1},
		{"dispatch, park, resolve", seq(ex([]string{"a", "b"}, nil), park, ex([]string{"c"}, []string{"b", "a"}), park, ex(nil, []string{"c"})), NonBlocking, -1},
		{"pending at end", seq(ex([]string{"a"}, nil), park, ex(nil, nil)), NonBlocking, -1},
		{"resolve own dispatch", seq(ex([]string{"a"}, nil), park, ex([]string{"b"}, []string{"a", "b"})), Blocked, 3},
		{"never dispatched", seq(ex(nil, []string{"x"})), Malformed, 0},
		{"resolved twice across", seq(ex([]string{"a"}, nil), park, ex(nil, []string{"a"}), park, ex(nil, []string{"a"})), Malformed, 6},
		{"resolved twice within", seq(ex([]string{"a"}, nil), park, ex(nil, []string{"a", "a"})), Malformed, 3},
		{"dispatched twice across", seq(ex([]string{"a"}, nil), park, ex([]string{"a"}, nil)), Malformed, 3},
		{"dispatched twice within", ex([]string{"a", "a"}, nil), Malformed, 0},
		{"redispatch after resolve", seq(ex([]string{"a"}, nil), park, ex(nil, []string{"a"}), park, ex([]string{"a"}, nil)), Malformed, 6},
		{"malformed outranks blocked", ex([]string{"a"}, []string{"a", "zz"}), Malformed, 0},
		{"first finding decides", seq(ex([]string{"a"}, []string{"a"}), park, ex(nil, []string{"q"})), Blocked, 0},
	} {
		v := Proof(c.segs)
		if v.Kind != c.want || v.Segment != c.seg {
			t.Errorf("%s: got %v, want %s at %d", c.name, v, c.want, c.seg)
		}
	}
}
