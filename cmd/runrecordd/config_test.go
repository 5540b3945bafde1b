package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// serveFlagSet is serve's flags, as cmdServe declares them.
func serveFlagSet(t *testing.T) (*serveFlags, *flag.FlagSet) {
	t.Helper()
	f := &serveFlags{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	f.register(fs)
	return f, fs
}

// configKeyLine is a key's line in deploy/config.toml, commented out.
var configKeyLine = regexp.MustCompile(`^#([a-z][a-z0-9-]*) = `)

// deploy/config.toml documents every serve flag but --config, and no
// other key; with every key uncommented it parses, applies, and sets each
// flag to its default (on-stop names the default "" means: park).
func TestShippedConfig(t *testing.T) {
	b, err := os.ReadFile("../../deploy/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if m := configKeyLine.FindStringSubmatch(line); m != nil {
			if slices.Contains(keys, m[1]) {
				t.Errorf("key %s twice", m[1])
			}
			keys = append(keys, m[1])
			line = strings.TrimPrefix(line, "#")
		}
		lines = append(lines, line)
	}
	_, fs := serveFlagSet(t)
	var flags []string
	fs.VisitAll(func(fl *flag.Flag) {
		if fl.Name != configFlag {
			flags = append(flags, fl.Name)
		}
	})
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(flags, k) {
			t.Errorf("deploy/config.toml has key %s, which is no serve flag", k)
		}
	}
	for _, fl := range flags {
		if !slices.Contains(keys, fl) {
			t.Errorf("serve --%s has no key in deploy/config.toml", fl)
		}
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	f, fs := serveFlagSet(t)
	if err := applyConfigFile(fs, path, true); err != nil {
		t.Fatal(err)
	}
	fs.VisitAll(func(fl *flag.Flag) {
		want := fl.DefValue
		if fl.Name == "on-stop" {
			want = onStopPark
		}
		if got := fl.Value.String(); got != want {
			t.Errorf("deploy/config.toml: %s = %q, but the flag's default is %q", fl.Name, got, want)
		}
	})
	if _, err := f.check(); err != nil {
		t.Errorf("the defaults, from the file: %v", err)
	}
}

// Flags override the file; the file sets the rest; arrays repeat a flag.
func TestConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	const cfg = `
log-level = "debug"
warm-pool = 3
lease-ttl = "30s"
chunked-images = true
bundle-mount-allow = ["/srv/a", "/srv/b"]
min-free = 2048
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	f, fs := serveFlagSet(t)
	if err := fs.Parse([]string{"--config", path, "--warm-pool", "5"}); err != nil {
		t.Fatal(err)
	}
	if err := f.applyConfigFile(fs); err != nil {
		t.Fatal(err)
	}
	if f.level != "debug" || f.warmPool != 5 || f.leaseTTL != 30*time.Second || !f.chunkedImages ||
		!slices.Equal(f.mounts, []string{"/srv/a", "/srv/b"}) || f.minFree != 2048 {
		t.Fatalf("applied: level %s warm-pool %d lease-ttl %v chunked %v mounts %v min-free %d",
			f.level, f.warmPool, f.leaseTTL, f.chunkedImages, f.mounts, f.minFree)
	}
}

// A bad file is a usage error naming the file and the key.
func TestConfigFileRefused(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{`wram-pool = 3`, `unknown key "wram-pool"`},
		{`config = "/etc/other.toml"`, `unknown key "config"`},
		{"[etcd]\nendpoints = \"x\"", `etcd: a table`},
		{"[fleet]\netcd = \"x\"", `unknown key "fleet"`},
		{`chunked-images = "yes"`, `chunked-images: want true or false`},
		{`warm-pool = true`, `warm-pool: not a boolean setting`},
		{`warm-pool = "many"`, `warm-pool: parse error`},
		{`bundle-mount-allow = "/srv"`, `bundle-mount-allow: want an array of strings`},
		{`bundle-mount-allow = [1]`, `bundle-mount-allow: an array of strings, not of int64`},
		{`log-level = ["debug"]`, `log-level: takes one value, not an array`},
		{`gc-interval = 1.5`, `gc-interval: unsupported value of type float64`},
		{`log-level = `, `toml: `},
	} {
		path := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, fs := serveFlagSet(t)
		err := applyConfigFile(fs, path, true)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "config "+path+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a usage error with %q", c.body, err, c.want)
		}
	}
	_, fs := serveFlagSet(t)
	if err := applyConfigFile(fs, filepath.Join(dir, "none.toml"), false); err != nil {
		t.Errorf("an absent default file: %v", err)
	}
	if err := applyConfigFile(fs, filepath.Join(dir, "none.toml"), true); !errors.As(err, new(usageError)) {
		t.Errorf("an absent --config file: %v, want a usage error", err)
	}
}

// A config file another user could have written is refused: it sets what
// the daemon runs as root with (user namespaces off, mount allow-lists,
// the fleet's etcd), so it is the daemon's user's or root's, and neither
// its group nor others may write it.
func TestConfigFileWritableByOthers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte("warm-pool = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o620, 0o602, 0o666} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, fs := serveFlagSet(t)
		err := applyConfigFile(fs, path, true)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "config "+path+": writable by its group or others") {
			t.Errorf("mode %v: %v, want a usage error: writable by its group or others", mode, err)
		}
		// The default path is refused alike: only its absence is not an error.
		if err := applyConfigFile(fs, path, false); !errors.As(err, &ue) {
			t.Errorf("mode %v, as the default file: %v, want a usage error", mode, err)
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, fs := serveFlagSet(t); applyConfigFile(fs, path, true) != nil {
		t.Fatalf("mode 0644, this user's: %v", applyConfigFile(fs, path, true))
	}
	if os.Geteuid() != 0 {
		return // only root can give the file to another user
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, fs := serveFlagSet(t)
	err := applyConfigFile(fs, path, true)
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("a file of uid 65534: %v, want a usage error naming its owner", err)
	}
}

// --egress-allow takes IPv4 networks only, each as its network address.
func TestEgressAllowFlag(t *testing.T) {
	for _, c := range []struct {
		arg string
		ok  bool
	}{{"192.0.2.0/24", true}, {"0.0.0.0/0", true}, {"192.0.2.1/24", false}, {"2001:db8::/32", false}, {"example.com", false}, {"192.0.2.0", false}} {
		f, fs := serveFlagSet(t)
		if err := fs.Parse([]string{"--egress-allow", c.arg}); err != nil {
			t.Fatal(err)
		}
		_, err := f.check()
		var ue usageError
		if c.ok != (err == nil) || (err != nil && !errors.As(err, &ue)) {
			t.Errorf("--egress-allow %s: %v", c.arg, err)
		}
		if c.ok && (len(f.egressAllow) != 1 || f.egressAllow[0].String() != c.arg) {
			t.Errorf("--egress-allow %s: ceiling %v", c.arg, f.egressAllow)
		}
	}
}

// --egress-resolver takes an IPv4 address and port, and only with a
// ceiling: a name's addresses are held to it.
func TestEgressResolverFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--egress-allow", "192.0.2.0/24", "--egress-resolver", "192.0.2.53:53"}, true},
		{[]string{"--egress-resolver", "192.0.2.53:53"}, false},
		{[]string{"--egress-allow", "192.0.2.0/24", "--egress-resolver", "192.0.2.53"}, false},
		{[]string{"--egress-allow", "192.0.2.0/24", "--egress-resolver", "[2001:db8::1]:53"}, false},
		{[]string{"--egress-allow", "192.0.2.0/24", "--egress-resolver", "192.0.2.53:0"}, false},
	} {
		f, fs := serveFlagSet(t)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		_, err := f.check()
		var ue usageError
		if c.ok != (err == nil) || (err != nil && !errors.As(err, &ue)) {
			t.Errorf("%v: %v", c.args, err)
		}
		if c.ok != f.egressResolver.IsValid() || c.ok != f.platform.EgressNames {
			t.Errorf("%v: resolver %v, platform names %v", c.args, f.egressResolver, f.platform.EgressNames)
		}
	}
}

// --egress-pool, --egress-link-prefix and --egress-park-hold take what
// internal/egress and the daemon can use, and nothing else.
func TestEgressLinksFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{nil, true},
		{[]string{"--egress-pool", "10.253.0.0/24", "--egress-link-prefix", "rrdx", "--egress-park-hold", "90s"}, true},
		{[]string{"--egress-pool", "10.253.0.0/8"}, false},
		{[]string{"--egress-pool", "10.253.0.1/24"}, false},
		{[]string{"--egress-pool", "fd00::/64"}, false},
		{[]string{"--egress-link-prefix", ""}, false},
		{[]string{"--egress-link-prefix", "rrde1"}, false},
		{[]string{"--egress-link-prefix", "abcdefghijk"}, false},
		{[]string{"--egress-park-hold", "0s"}, false},
	} {
		f, fs := serveFlagSet(t)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		_, err := f.check()
		var ue usageError
		if c.ok != (err == nil) || (err != nil && !errors.As(err, &ue)) {
			t.Errorf("%q: %v", c.args, err)
		}
	}
	f, fs := serveFlagSet(t)
	if err := fs.Parse([]string{"--egress-pool", "10.253.0.0/24", "--egress-link-prefix", "rrdx", "--egress-park-hold", "90s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.check(); err != nil {
		t.Fatal(err)
	}
	if e := f.egress; e.Pool.String() != "10.253.0.0/24" || e.LinkPrefix != "rrdx" || e.ParkHold != 90*time.Second {
		t.Fatalf("the settings: %+v", e)
	}
}

// --lazy-resume and --lazy-served are on by default; --lazy-resume=false
// takes --lazy-served's default with it, not one given; whether
// --lazy-resume was given (a flag or a key) reaches the daemon's config.
func TestLazyFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("lazy-resume = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args                  []string
		resume, served, given bool
		usage                 string
	}{
		{nil, true, true, false, ""},
		{[]string{"--lazy-served=false"}, true, false, false, ""},
		{[]string{"--lazy-resume=false"}, false, false, false, ""},
		{[]string{"--lazy-resume"}, true, true, true, ""},
		{[]string{"--config", path}, true, true, true, ""},
		{[]string{"--config", path, "--lazy-resume=false"}, false, false, false, ""},
		{[]string{"--lazy-resume=false", "--lazy-served"}, false, true, false, "--lazy-served needs --lazy-resume"},
	}
	for _, c := range cases {
		f, fs := serveFlagSet(t)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if f.configFile != "" { // not the host's own config
			if err := f.applyConfigFile(fs); err != nil {
				t.Fatal(err)
			}
		}
		f.given(fs)
		_, err := f.check()
		if c.usage != "" {
			if err == nil || !strings.Contains(err.Error(), c.usage) {
				t.Errorf("%q: %v, want %q", c.args, err, c.usage)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		cfg, err := f.config(nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.LazyResume != c.resume || cfg.LazyServed != c.served || cfg.LazyGiven != c.given {
			t.Errorf("%q: lazy-resume %v, lazy-served %v, given %v; want %v %v %v", c.args,
				cfg.LazyResume, cfg.LazyServed, cfg.LazyGiven, c.resume, c.served, c.given)
		}
	}
}
