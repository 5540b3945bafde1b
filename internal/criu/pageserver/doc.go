// Package pageserver serves a lazily restored unit's pages to `criu
// lazy-pages --page-server` over an inherited socket, verifying each
// stored chunk against its listed address the first time any of its
// pages is asked for (docs/lazy-resume.md, "The page server").
//
// A lazy resume of a park in the chunked form checks before the restore
// that the memory image's listing hashes to the recorded address and that
// every file CRIU reads itself (the small images, the eager pages) is the
// one listed; the listing names every chunk by its address, so a chunk
// verified as it is served is a chunk of the recorded snapshot. A chunk
// whose bytes hash elsewhere is never served ([ErrRefused]): the server
// hangs up, lazy-pages fails, and the daemon, which holds the unit's
// userfaultfds, freezes and kills the unit before any thread reads a page
// that did not come. The server hangs up only while the daemon says it
// holds them ([Server.Hold]); otherwise a refusal keeps the connection.
//
// The server runs as a process of its own ([Command], [MaybeRun]): the
// unit needs its pages even when the daemon stops. It reads its extent
// table ([Table.Encode]: one task per process with a pagemap, its extents
// in address order, whole pages, a verified one a whole chunk at its
// offset in its file, a slab) on stdin,
// answers lazy-pages on one end of a socket pair (`criu lazy-pages
// --page-server --ps-socket 4`) in CRIU's page-transfer protocol
// (serve.go), and exits 3 when it refused a chunk.
//
// The package also runs the lazy restore's `criu lazy-pages`
// ([StartLazyPages]), with a page server or reading the image directory
// itself, watches it until every page is resident ([LazyPages]), and
// records both processes' pids so that a restarted daemon can tell a
// restore still serving from one left unfinished, and kill what is left
// ([Pids]).
//
// A verified chunk's pages are sent only from the bytes that were hashed:
// a chunk sent in parts is kept until its last page went (up to 64 MiB of
// such chunks), or read and hashed again.
package pageserver
