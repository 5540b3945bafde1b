package daemon

import "github.com/runrecordd/runrecordd/internal/answers"

// Pin keeps run id's snapshots whatever the retention time; Unpin lets
// them go with it again. Collection itself is internal/retention's
// (retention.Collector: GC, and the periodic Run the daemon starts).
func (d *Daemon) Pin(id string, pin bool) (answers.Summary, error) {
	r, err := d.runs.lockRun(id)
	if err != nil {
		return answers.Summary{}, err
	}
	defer r.mu.Unlock()
	if pin {
		err = d.st.Pin(id)
	} else {
		err = d.st.Unpin(id)
	}
	if err != nil {
		return answers.Summary{}, err
	}
	return d.runs.summary(id, r)
}
