package manifest

import (
	"fmt"
	"strings"
)

// Rule is how a resume judges one recorded key against this host.
type Rule int

// The rules (docs/manifest.md gives each key's, with its reason).
const (
	// Match: the run's bytes depend on the value, so this host's must
	// be the recorded one.
	Match Rule = iota
	// Flags: the value is a sorted flag list, and this host must have
	// every recorded flag; more are fine.
	Flags
	// Probe: only this host's ability to restore depends on the value,
	// and the image-park probe judges that (image resumes wait on its
	// gate). The value is recorded for the auditor, not compared.
	Probe
	// Format: the value is a CRIU version, and the image format it
	// writes ([CRIUFormat]) must be this host's criu.images (format 1's
	// criu.version, which stands for the criu.images it lacks).
	Format
)

func (r Rule) String() string {
	switch r {
	case Flags:
		return "flags"
	case Probe:
		return "probe"
	case Format:
		return "format"
	}
	return "match"
}

// RuleOf is the rule for key in a manifest of the given format. Format 1
// recorded no criu.images: its criu.version stands for it. cpu.features,
// a hash of the flags (format 1), can only be matched. A key this host
// does not know must match, which it cannot.
func RuleOf(format int, key string) Rule {
	switch key {
	case KernelRelease, RuncVersion, ContainerdVersion:
		return Probe
	case CRIUVersion:
		if format == Format1 {
			return Format
		}
		return Probe
	case CPUFlags:
		return Flags
	}
	return Match
}

// Difference is one recorded key this host does not satisfy.
type Difference struct {
	Key      string
	Rule     Rule
	Recorded string
	Current  string // "" with Absent set when this host has no value
	Absent   bool
	// Lacking are the recorded flags this host lacks (Rule Flags).
	Lacking []string
	// Malformed says why the recorded value is not one Rule reads.
	Malformed string
}

func (d Difference) String() string {
	switch {
	case d.Malformed != "":
		return fmt.Sprintf("%s: recorded %q is %s", d.Key, cut(d.Recorded), d.Malformed)
	case d.Absent:
		return fmt.Sprintf("%s: recorded %q, this host has none", d.Key, cut(d.Recorded))
	case len(d.Lacking) > 0:
		shown := d.Lacking[:min(len(d.Lacking), maxShown)]
		more := ""
		if n := len(d.Lacking) - len(shown); n > 0 {
			more = fmt.Sprintf(" and %d more", n)
		}
		return fmt.Sprintf("%s: this host lacks %s%s", d.Key, cut(strings.Join(shown, " ")), more)
	}
	return fmt.Sprintf("%s: recorded %q, this host %q", d.Key, cut(d.Recorded), cut(d.Current))
}

// maxShown and maxQuoted bound what a difference quotes: a recorded
// manifest may come from another host.
const (
	maxShown  = 16
	maxQuoted = 128
)

func cut(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	return s[:maxQuoted] + "…"
}

// Judge returns the keys of recorded that host does not satisfy, each by
// its rule ([RuleOf]), sorted by key; none when host satisfies recorded.
func Judge(recorded, host Manifest) []Difference {
	format := recorded.Version()
	var out []Difference
	for _, k := range recorded.Keys() {
		want := recorded[k]
		d := Difference{Key: k, Rule: RuleOf(format, k), Recorded: want}
		got, ok := host[k]
		switch {
		case d.Rule == Probe:
			continue
		case d.Rule == Format:
			d.Recorded = CRIUFormat(want)
			got, ok = host[CRIUImages]
		}
		switch {
		case !ok:
			d.Absent = true
		case d.Rule == Flags:
			d.Current = got
			if d.Lacking, d.Malformed = lacking(want, got); d.Lacking == nil && d.Malformed == "" {
				continue
			}
		case got == d.Recorded:
			continue
		default:
			d.Current = got
		}
		out = append(out, d)
	}
	return out
}

// lacking returns the flags of the list want that the list have lacks, or
// why want is not a flag list: flags sorted, each once, joined by single
// spaces, as [CPUOf] writes them.
func lacking(want, have string) ([]string, string) {
	if want == "" {
		return nil, ""
	}
	w := strings.Split(want, " ")
	for i, f := range w {
		if f == "" || strings.ContainsAny(f, "\t\n\r\v\f") || (i > 0 && f <= w[i-1]) {
			return nil, "not a sorted flag list"
		}
	}
	has := map[string]bool{}
	for _, f := range strings.Fields(have) {
		has[f] = true
	}
	var out []string
	for _, f := range w {
		if !has[f] {
			out = append(out, f)
		}
	}
	return out, ""
}
