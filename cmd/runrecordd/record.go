package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/runrecordd/runrecordd"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func cmdConformance(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	output := fs.String("o", "table", "output: table or json")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	var classes []conformance.Class
	switch len(pos) {
	case 0:
		classes, err = conformance.LoadFS(runrecordd.Conformance, "testdata/conformance")
	case 1:
		classes, err = conformance.Load(pos[0])
	default:
		return usagef("at most one directory, got %d arguments", len(pos))
	}
	if err != nil {
		return err
	}
	type classResult struct {
		Class  string   `json:"class"`
		Cases  int      `json:"cases"`
		Passed bool     `json:"passed"`
		Failed []string `json:"failed"`
	}
	out := []classResult{}
	failed := 0
	for _, c := range classes {
		res := conformance.Run(c)
		if !res.Passed() {
			failed++
		}
		out = append(out, classResult{res.Class, res.Cases, res.Passed(), append([]string{}, res.Failed...)})
	}
	if err := printAs(stdout, *output, out, func(w io.Writer) {
		for _, r := range out {
			if r.Passed {
				fmt.Fprintf(w, "%-4s passed (%d cases)\n", r.Class, r.Cases)
				continue
			}
			fmt.Fprintf(w, "%-4s FAILED (%d of %d cases)\n", r.Class, len(r.Failed), r.Cases)
			for _, f := range r.Failed {
				fmt.Fprintf(w, "     %s\n", f)
			}
		}
	}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d classes failed", failed, len(classes))
	}
	return nil
}

func cmdVerify(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	file := fs.String("file", "", "a record's wire form (- for standard input)")
	var cf clientFlags
	cf.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *file == "" && len(pos) == 1 {
		return verifyRun(cf, pos[0], stdout)
	}
	if *file == "" || len(pos) != 0 {
		return usagef("give the run (verify RUN) or the record with --file FILE")
	}
	in, err := openInput(*file)
	if err != nil {
		return err
	}
	defer in.Close()
	br := bufio.NewReader(in)
	if first, err := br.Peek(1); err == nil && first[0] != '{' {
		return verifyBundle(cf, *file, br, stdout)
	}
	b, err := io.ReadAll(br)
	if err != nil {
		return err
	}
	r, err := record.DecodeWire(b)
	if err != nil {
		return fmt.Errorf("%s does not verify: %w", *file, err)
	}
	if err := checkOutput(cf.output); err != nil {
		return err
	}
	out := struct {
		Segments  int    `json:"segments"`
		Phase     string `json:"phase"`
		Head      string `json:"head"`
		WaitProof string `json:"wait_proof"`
	}{r.Len(), r.Phase().String(), r.Head().String(), r.WaitProof().String()}
	return printAs(stdout, cf.output, out, func(w io.Writer) {
		fmt.Fprintf(w, "verified from genesis: %d segments, %s, head %s\n", out.Segments, out.Phase, out.Head)
		fmt.Fprintf(w, "wait proof: %s\n", out.WaitProof)
	})
}

// verifyBundle is `verify --file BUNDLE`: the bundle is read and judged as
// an import judges it (internal/bundle), in a scratch store that is removed
// after, with no grant policy; its signers are judged by the daemon's
// trusted keys when a daemon answers, and reported unjudged otherwise.
func verifyBundle(cf clientFlags, name string, r io.Reader, stdout io.Writer) error {
	dir, err := os.MkdirTemp("", "runrecordd-verify-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := store.Open(dir)
	if err != nil {
		return err
	}
	defer st.Close()
	cx, cancel := ctx()
	defer cancel()
	sb, err := bundle.Stage(cx, st, r, bundle.Options{})
	if err != nil {
		return fmt.Errorf("%s does not verify: %w", name, err)
	}
	defer sb.Close()
	var keys []api.TrustedKey
	judged := false
	if c, err := cf.client(); err == nil {
		kcx, kcancel := context.WithTimeout(cx, 10*time.Second)
		keys, err = c.TrustedKeys(kcx)
		kcancel()
		judged = err == nil
	}
	names := map[string]string{}
	for _, k := range keys {
		names[k.Key] = k.Name
	}
	var signers []api.Signer
	var untrusted []string
	for _, s := range sb.Signers {
		name, ok := names[s.Key.String()]
		signers = append(signers, api.Signer{Segment: s.Index, Interval: s.Interval, Key: s.Key.String(), Name: name, Trusted: ok})
		if judged && !ok {
			untrusted = append(untrusted, s.Key.String())
		}
	}
	rec := sb.Record
	out := struct {
		Run      string       `json:"run"`
		Segments int          `json:"segments"`
		Phase    string       `json:"phase"`
		Head     string       `json:"head"`
		Objects  int          `json:"objects"`
		Bytes    int64        `json:"bytes"`
		Judged   bool         `json:"trust_judged"`
		Signers  []api.Signer `json:"signers"`
	}{sb.Header.Run, rec.Len(), rec.Phase().String(), rec.Head().String(), sb.Objects, sb.Bytes, judged, signers}
	if err := cf.print(stdout, out, func(w io.Writer) {
		fmt.Fprintf(w, "bundle of %s verified from genesis: %d segments, %s, head %s\n", printable(sb.Header.Run), rec.Len(), rec.Phase(), rec.Head())
		fmt.Fprintf(w, "objects: %d rehashed, %s; every attestation at its place\n", sb.Objects, bytesString(sb.Bytes))
		printGrants(w, sb.Grants)
		printSigners(w, signers, judged)
	}); err != nil {
		return err
	}
	if len(untrusted) > 0 {
		return &api.Error{Code: api.CodeUntrustedSigner, Signer: untrusted[0],
			Message: fmt.Sprintf("%s verifies, but this host does not trust its signer %s", name, untrusted[0])}
	}
	return nil
}
