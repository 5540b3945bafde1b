package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A run's secrets (docs/trust.md#secrets): its grant set names them; the
// values come with the request that starts or resumes it and are kept
// here only on the secrets tmpfs (internal/secrets), until the run
// closes or leaves this host.

// secretNames is grants with the names of values, a start's: a grant set
// that names none takes the values' names; one that names some must be
// given a value for each, and no other.
func secretNames(id string, grants unit.Grants, values map[string]string) (unit.Grants, error) {
	if len(grants.Secrets) == 0 {
		grants.Secrets = slices.Sorted(maps.Keys(values))
	} else {
		grants.Secrets = unit.SortSecrets(grants.Secrets)
	}
	for _, n := range grants.Secrets {
		if err := unit.CheckSecretName(n); err != nil {
			return grants, fmt.Errorf("run %s: %w", id, err)
		}
	}
	if err := secrets.Names(grants.Secrets, values); err != nil {
		return grants, fmt.Errorf("run %s: %w", id, err)
	}
	return grants, nil
}

// secretsFor makes sure this host holds every secret the grant set of
// run id names before it resumes: values, when given, must be all of
// them and replace what the host holds; without them the host must hold
// each already, else secrets.ErrRequired. Nothing changes on a refusal.
func secretsFor(h *secrets.Values, id string, names []string, values map[string]string) error {
	if len(values) > 0 {
		if err := secrets.Names(names, values); err != nil {
			return fmt.Errorf("resume %s: %w", id, err)
		}
		return h.Put(id, values)
	}
	if missing := h.Missing(id, names); len(missing) > 0 {
		return fmt.Errorf("resume %s: %w: this host holds no value for %s; resume with --secret NAME=VALUE for each",
			id, secrets.ErrRequired, strings.Join(missing, ", "))
	}
	return nil
}

// dropSecrets removes run id's values from h: it closed or left.
func dropSecrets(h *secrets.Values, id string, log *slog.Logger) {
	if err := h.Remove(id); err != nil {
		log.Error("secrets not removed; the next start retries", "run", id, "err", err)
	}
}

// sweepSecrets removes from h, at a start, the values of runs that no
// longer need them here (st says): closed, unknown, or handed to another
// host.
func sweepSecrets(h *secrets.Values, st *store.Store, log *slog.Logger) {
	runs, err := h.Runs()
	if err != nil {
		log.Warn("reconcile: the secrets held here not listed", "err", err)
		return
	}
	for _, id := range runs {
		r, err := st.Run(id)
		gone := errors.Is(err, store.ErrNoRun) || (err == nil && r.Phase == record.PhaseClosed)
		if err == nil && !gone {
			_, gone, err = st.HandedOff(id)
		}
		if err != nil && !errors.Is(err, store.ErrNoRun) {
			log.Warn("reconcile: the secrets of a run not read; kept", "run", id, "err", err)
			continue
		}
		if gone {
			dropSecrets(h, id, log)
		}
	}
}
