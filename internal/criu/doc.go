// Package criu reads CRIU's image directories as hostile input, and
// judges them against what this host grants. It is also the one package
// that speaks CRIU otherwise (with internal/criu/pageserver under it,
// for lazy-pages): the configuration runc passes to every dump and
// restore and the sandboxes' CRIU directories ([Dirs]), CRIU's
// statistics ([ReadDumpStats]), its version, `criu check` and the probe
// of a plain process ([ProbeProcess]), and the build record ([Identify]).
//
// A signature says who wrote a snapshot; it does not say that this host
// would have made it. CRIU restores credentials, capability sets,
// securebits, seccomp modes, namespaces, mounts and open files from the
// images as they are, and runc's restore re-applies none of the unit's
// spec. So before every restore the executor reads the images ([Read])
// and refuses, with a [*RefusedError] wrapping [ErrRefused], any that
// grant more than the sandbox it restores into ([Images.Judge] under
// [PolicyOf] that sandbox's OCI spec): docs/trust.md, "What a restore
// may grant". What only narrows the unit the executor rewrites, in its
// staged copy of the images, instead of refusing: the spec's limits and
// oom_score_adj ([Images.Narrow]), the spec's seccomp filter stacked on
// every thread ([Images.Stack]).
//
// # Reading
//
// Every file of the directory must be an image CRIU writes, named as CRIU
// names it (core-7.img, never core-07.img), a regular file. Each kind
// has a verdict: refused outright, harmless (its framing checked), or
// checked (decoded with go-criu's generated types and judged). The pages
// are never opened. Every length and count is bounded ([MaxFiles],
// [MaxImage], [MaxImages], [MaxEntries]) before anything is held for it.
//
// # Caveats
//
// go-criu's protos are CRIU 4.1's: the creds fields CRIU 4.2 added
// (no_new_privs, cap_amb) and the pidfd file type are read from the
// unknown fields. Like protobuf-c, the decoder keeps the low 32 bits of a
// uint32 field, and the last value of a field given twice.
package criu
