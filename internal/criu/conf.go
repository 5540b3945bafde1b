package criu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// ConfAnnotation is the OCI annotation that names the CRIU configuration
// file runc passes to CRIU at every dump and restore of a container.
const ConfAnnotation = "org.criu.config"

// Conf is the CRIU configuration of every dump and restore of a sandbox
// (CRIU reads it over the options runc sends). Each line is here because
// no option of containerd's task API reaches CRIU with it: the runc shim
// (2.3 as 1.6) gives `runc restore` the image, work and parent paths and
// nothing else, and a checkpoint's options (runc's CheckpointOptions)
// have no field for the last two:
//
//   - tcp-established: established TCP connections are dumped and restored
//     with TCP repair, so a unit's connections to itself go on after a
//     resume. The dump has it from the checkpoint's OpenTcp too; a restore
//     of an image holding such a connection fails without it ("Connected
//     TCP socket in image"), and only this file gives it to the restore.
//   - skip-in-flight: a connection still in its handshake is left out of
//     the dump (its client retries the SYN) instead of failing it (runc's
//     --tcp-skip-in-flight, which the shim never passes).
//   - network-lock nftables: the sandbox's network is locked during a dump
//     and unlocked at the end of a restore with one nftables table instead
//     of iptables rules (CRIU's default), whose unlock forks
//     iptables-restore several times (docs/lazy-resume.md). runc has no
//     option for it. The method is recorded in the images, so a park
//     dumped with iptables still restores with it.
const Conf = "tcp-established\nskip-in-flight\nnetwork-lock nftables\n"

// LazyConf is a lazy restore's configuration: Conf and lazy-pages. (runc
// restore has --lazy-pages, but containerd's runc shim passes no CRIU
// option to a restore.)
const LazyConf = Conf + "lazy-pages\n"

// confName is a configuration file's name.
const confName = "criu.conf"

// Dirs are CRIU's files of an executor whose state directory is State:
//
//	State/criu.conf        Conf, which every sandbox's ConfAnnotation names
//	State/criu/ID/         sandbox ID's: removed with the sandbox
//	  dump/, restore/      CRIU's work directories (logs, statistics)
//	  criu.conf            the sandbox's own configuration (a lazy restore's)
//	  *.pid                its lazy-pages' and page server's pids
//	  lazy-pages.resident  when its lazy-pages exited, every page in
type Dirs struct{ State string }

// Conf is the configuration file every sandbox's dump and restore read.
func (d Dirs) Conf() string { return filepath.Join(d.State, confName) }

// Root holds a directory per sandbox.
func (d Dirs) Root() string { return filepath.Join(d.State, "criu") }

// Of is sandbox id's directory.
func (d Dirs) Of(id string) string { return filepath.Join(d.Root(), id) }

// Dump is the work directory of sandbox id's dumps.
func (d Dirs) Dump(id string) string { return filepath.Join(d.Of(id), "dump") }

// Restore is the work directory of sandbox id's restores.
func (d Dirs) Restore(id string) string { return filepath.Join(d.Of(id), "restore") }

// ConfOf is sandbox id's own configuration file, which a lazily restored
// container's ConfAnnotation names.
func (d Dirs) ConfOf(id string) string { return filepath.Join(d.Of(id), confName) }

// Make makes Root and writes Conf, durably.
func (d Dirs) Make() error {
	if err := os.MkdirAll(d.Root(), 0o700); err != nil {
		return err
	}
	return writeConf(d.Conf(), Conf)
}

// WriteConfOf writes conf (Conf or LazyConf) as sandbox id's own
// configuration, durably.
func (d Dirs) WriteConfOf(id, conf string) error { return writeConf(d.ConfOf(id), conf) }

// RepairConfOf makes sandbox id's own configuration, if it has one (a
// lazily restored sandbox's), Conf, and reports whether it had to: a dump
// that read the lazy-pages line would leave the lazy pages out of the
// images and wait for a page server to take them, until its deadline. A
// lazy restore rewrites the file once it returns; a daemon that crashed
// before that left the line, and every dump repairs it first.
func (d Dirs) RepairConfOf(id string) (bool, error) {
	conf := d.ConfOf(id)
	b, err := os.ReadFile(conf)
	if errors.Is(err, os.ErrNotExist) || err == nil && string(b) == Conf {
		return false, nil
	}
	if err == nil {
		err = writeConf(conf, Conf)
	}
	if err != nil {
		return false, fmt.Errorf("the sandbox's CRIU configuration: %w", err)
	}
	return true, nil
}

// writeConf writes conf to path through a temporary file and a rename,
// the file and its directory synced.
func writeConf(path, conf string) error {
	return atomicfile.Write(path, 0o600, func(f *os.File) error {
		_, err := f.WriteString(conf)
		return err
	})
}
