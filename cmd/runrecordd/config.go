package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"syscall"

	"github.com/BurntSushi/toml"
)

// defaultConfigFile is the config file serve reads when --config is not
// given, if it exists (docs/operations.md, "Config file").
const defaultConfigFile = "/etc/runrecordd/config.toml"

// configFlag is the flag naming the config file: the one serve flag the
// file does not set.
const configFlag = "config"

// applyConfigFile sets, from the TOML config file at path, every flag of
// fs the command line did not set. Its keys are the flags' names; a flag
// that repeats takes an array of strings, a bool flag a boolean, any
// other a string or an integer. An unknown key, a value of the wrong type
// or one the flag refuses is a usage error naming the key, and so is a
// file others could have written (readConfigFile). explicit says
// whether the path was given (--config): the default path may be absent.
// The config file's keys are fs's flags: docs/daemon.md's table.
func applyConfigFile(flags *flag.FlagSet, path string, explicit bool) error {
	b, err := readConfigFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if !explicit {
			return nil
		}
		return usagef("--config: %v", err)
	}
	if err != nil {
		return err
	}
	var keys map[string]any
	if _, err := toml.Decode(string(b), &keys); err != nil {
		return usagef("config %s: %v", path, err)
	}
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names) // the first bad key, always the same
	for _, k := range names {
		fl := flags.Lookup(k)
		if fl == nil || k == configFlag {
			return usagef("config %s: unknown key %q (the keys are serve's flags, without --config: runrecordd serve -h)", path, k)
		}
		if set[k] {
			continue // the command line overrides the file
		}
		if err := setFromTOML(flags, fl, keys[k]); err != nil {
			return usagef("config %s: %s: %v", path, k, err)
		}
	}
	return nil
}

// readConfigFile reads the config file at path, refused (a usage error)
// when a user other than this process's or root owns it, or its group or
// others may write it: it sets what the daemon runs as root with (user
// namespaces, mount allow-lists, the fleet's etcd). The checks are of the
// file read, not of its name.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, usagef("--config: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, usagef("--config: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, usagef("config %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return nil, usagef("config %s: writable by its group or others (mode %v): chmod go-w it", path, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return nil, usagef("config %s: owned by uid %d, neither root nor this process's user", path, st.Uid)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, usagef("--config: %v", err)
	}
	return b, nil
}

// setFromTOML sets fl to v, a TOML value of the type the flag takes.
func setFromTOML(flags *flag.FlagSet, fl *flag.Flag, v any) error {
	_, repeats := fl.Value.(*listFlag)
	bf, isBool := fl.Value.(interface{ IsBoolFlag() bool })
	switch v := v.(type) {
	case bool:
		if !isBool || !bf.IsBoolFlag() {
			return errors.New("not a boolean setting")
		}
		return flags.Set(fl.Name, strconv.FormatBool(v))
	case []any:
		if !repeats {
			return errors.New("takes one value, not an array")
		}
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return fmt.Errorf("an array of strings, not of %T", e)
			}
			if err := flags.Set(fl.Name, s); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		return errors.New("a table: the file holds keys only, no tables")
	case string, int64:
		switch {
		case isBool && bf.IsBoolFlag():
			return fmt.Errorf("want true or false, not %T", v)
		case repeats:
			return errors.New("want an array of strings")
		}
		return flags.Set(fl.Name, fmt.Sprint(v))
	}
	return fmt.Errorf("unsupported value of type %T", v)
}
