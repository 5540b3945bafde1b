package criu

import (
	"fmt"
	"slices"
	"strings"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/rlimit"
	"google.golang.org/protobuf/proto"
)

// A task's resource limits and oom_score_adj are in its leader's core
// (tc.rlimits, one entry per resource from 0; tc.oom_score_adj). CRIU
// 4.2 restores the limits it lists and leaves the others as its own
// process has them (the host's), sets soft to hard where soft is above,
// and leaves its own oom_score_adj where the image has none or 0
// (criu/cr-restore.c).

// Narrow rewrites the image directory dir, whose images im are and which
// Judge has passed under p, so that every task is restored with no more
// than p gives: each soft and hard limit the spec sets lowered to the
// spec's hard one (soft to at most hard), a limit the images lack set to
// the spec's, an oom_score_adj below the spec's (or none) raised to it.
// Limits only narrow, as filters do ([Images.Stack]): a park made under
// other limits (an earlier runrecordd's, another host's) resumes under
// this spec's. A spec that grants CAP_SYS_RESOURCE, with which the unit
// sets its own, narrows nothing. It writes the cores (core-PID.img) it
// changes anew, with the owner and mode of the file each replaces; it
// refuses, before writing anything, a task it cannot narrow (judgeTask).
func (im *Images) Narrow(dir string, p Policy) error {
	for _, t := range im.Tasks {
		pid := t.GetPid()
		c := im.Cores[pid]
		if c == nil {
			return refuse(pid, fmt.Sprintf("core-%d.img", pid), "", "missing")
		}
		if err := judgeTask(pid, fmt.Sprintf("core-%d.img", pid), c, p); err != nil {
			return err
		}
	}
	for _, t := range im.Tasks {
		pid := t.GetPid()
		name := fmt.Sprintf("core-%d.img", pid)
		changed, err := narrowTask(pid, name, im.Cores[pid], p)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		if err := rewriteImage(dir, name, coreMagic, im.Cores[pid]); err != nil {
			return err
		}
	}
	return nil
}

// narrowTask brings task pid's limits and oom_score_adj (in c, its
// leader's core, image name) within p, in place, and says whether it
// changed c. It refuses more than 64 limits, a task core missing where p
// sets limits or an oom_score_adj, and a limit missing from the images
// that comes before one p sets while p does not set it itself (CRIU
// lists limits from 0: it would have the host's).
func narrowTask(pid uint32, name string, c *criucore.CoreEntry, p Policy) (bool, error) {
	tc := c.GetTc()
	if n := len(tc.GetRlimits().GetRlimits()); n > 64 {
		return false, refuse(pid, name, "tc.rlimits", "%d limits", n)
	}
	if p.has(capSysResource) || (len(p.Rlimits) == 0 && p.OOMScoreAdj == nil) {
		return false, nil
	}
	if tc == nil {
		return false, refuse(pid, name, "tc", "missing, the spec sets the task's limits or oom_score_adj")
	}
	changed := false
	if len(p.Rlimits) > 0 {
		if tc.Rlimits == nil {
			tc.Rlimits = &criucore.TaskRlimitsEntry{}
		}
		ns := make([]int, 0, len(p.Rlimits))
		for n := range p.Rlimits {
			ns = append(ns, n)
		}
		slices.Sort(ns)
		for len(tc.Rlimits.Rlimits) <= ns[len(ns)-1] {
			n := len(tc.Rlimits.Rlimits)
			want, ok := p.Rlimits[n]
			if !ok {
				return false, refuse(pid, name, "tc.rlimits", "RLIMIT_%s missing, and the spec does not set it", strings.Fields(rlimitNames)[n])
			}
			tc.Rlimits.Rlimits = append(tc.Rlimits.Rlimits, &rlimit.RlimitEntry{Cur: proto.Uint64(want.Soft), Max: proto.Uint64(want.Hard)})
			changed = true
		}
		for _, n := range ns {
			e := tc.Rlimits.Rlimits[n]
			if e == nil {
				e = &rlimit.RlimitEntry{}
				tc.Rlimits.Rlimits[n] = e
			}
			hard := min(e.GetMax(), p.Rlimits[n].Hard)
			soft := min(e.GetCur(), hard)
			if e.Cur == nil || e.Max == nil || soft != e.GetCur() || hard != e.GetMax() {
				e.Cur, e.Max, changed = proto.Uint64(soft), proto.Uint64(hard), true
			}
		}
	}
	if p.OOMScoreAdj != nil {
		want := int32(max(-1000, min(1000, *p.OOMScoreAdj)))
		if tc.OomScoreAdj == nil || tc.GetOomScoreAdj() < want {
			tc.OomScoreAdj, changed = proto.Int32(want), true
		}
	}
	return changed, nil
}
